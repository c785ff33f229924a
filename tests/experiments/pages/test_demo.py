"""experiments/pages/demo.py: the plan is demo.yaml's one run without the keys that say how and
where it is launched (the engine runs it in-process), --quick the same shape on a problem of
seconds. The run and the page end to end: tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

import yaml

from experiments.pages import demo


def test_the_plan_is_demo_yaml_without_its_launch_keys():
    config = yaml.safe_load(demo.CONFIG.read_text())
    (run,) = demo.plan(False, {})
    assert run.key == "demo" and run.seed == config["seed"]
    assert not set(demo.LAUNCH_KEYS) & set(run.config) and "seed" not in run.config
    expected = {k: v for k, v in config.items() if k not in (*demo.LAUNCH_KEYS, "seed")}
    assert run.config == expected
    (quick,) = demo.plan(True, {})
    assert quick.config == dict(expected, **demo.QUICK) and quick.seed == run.seed
    assert quick.config["algorithm"] == config["algorithm"]  # the demo's algorithm, on less
