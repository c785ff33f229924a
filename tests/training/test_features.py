"""Config-driven features (training/features.py): a new feature is one file plus one line.

`support/example_feature.py` is such a file; the one line is `declare("example_feature")` in the
script that runs the CLI. It must be configured, validated, run as a hook, reported in the summary
and the progress line, without any change to the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gossip_powersgd.training import features
from gossip_powersgd.training.config import (
    TrainConfig,
    config_from_dict,
    hashed_config,
    parse_override,
)

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SUPPORT = TESTS / "support"
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
#: The one line, then the CLI.
LINE = "from gossip_powersgd.training.features import declare; declare('example_feature'); "
CLI = "from gossip_powersgd.cli.train import main; main()"


def _cli(*args, declare=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}{os.pathsep}{SUPPORT}")
    program = (LINE if declare else "") + CLI
    return subprocess.run(
        [sys.executable, "-c", program, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_an_example_feature_trains_through_the_cli(tmp_path):
    out = tmp_path / "run"
    result = _cli("--config", TINY, "--set", f"out_dir={out}", "--set", "step_counter.every=2")
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]  # 0 .. steps - 1, of which the even ones are counted
    assert steps > 2 and summary["counted_steps"] == len(range(0, steps, 2))
    counted = summary["counted_steps"]
    assert f"| steps counted (every 2) | {counted} |" in (out / "summary.md").read_text()
    assert f"counted {counted}" in result.stdout  # the progress line of the last evaluation
    assert "count_steps_every: 2" in (out / "config.yaml").read_text()  # the flat spelling


def test_the_example_features_validation_is_a_one_line_error(tmp_path):
    result = _cli(
        "--config", TINY, "--set", f"out_dir={tmp_path / 'run'}", "--set", "count_steps_every=-1"
    )
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert "'count_steps_every': -1 (must be >= 0 steps" in line
    assert not (tmp_path / "run").exists()


def test_without_its_line_the_feature_does_not_exist(tmp_path):
    result = _cli("--config", TINY, "--set", "count_steps_every=2", declare=False)
    assert result.returncode != 0
    assert "unknown config key 'count_steps_every'" in result.stderr


def test_nested_and_flat_spellings_are_one_config():
    nested = config_from_dict(
        {"dp": {"noise_multiplier": 1, "max_grad_norm": 2.0}, "observe": {"ranks": [1], "every": 3}}
    )
    flat = TrainConfig(
        dp_noise_multiplier=1.0, dp_max_grad_norm=2.0, observers=[1], observe_every=3
    )
    assert nested == flat and nested.to_dict() == flat.to_dict()
    assert parse_override("dp.delta=0.001") == ("dp_delta", 0.001)
    # Recording keys stay out of the checkpoint's hash, as when they were core keys.
    assert "observers" not in hashed_config(flat) and "dp_max_grad_norm" in hashed_config(flat)
    with pytest.raises(ValueError, match="dp_delta is set twice"):
        config_from_dict({"dp": {"delta": 1e-5}, "dp_delta": 1e-6})
    with pytest.raises(ValueError, match="unknown key 'sigma' in section 'dp'.*noise_multiplier"):
        config_from_dict({"dp": {"sigma": 1.0}})
    with pytest.raises(ValueError, match="bad value for 'observers'"):
        config_from_dict({"observe": {"ranks": "three"}})


def test_a_key_belongs_to_one_feature():
    with pytest.raises(ValueError, match="'dp_delta', which feature 'dp' already declares"):
        features.register(features.Feature(name="copy", keys=[features.Key("dp_delta", "float")]))
    assert "copy" not in [f.name for f in features.features()]


def test_the_trainer_builds_the_features_hooks_in_declared_order():
    config = TrainConfig(dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, observers=[0])
    names = [type(h).__name__ for h in features.feature_hooks(config)]
    assert names == ["DifferentialPrivacy", "ObserverHooks"]  # observers record what DP built
