"""Start-up: the training program's first line comes before torch is imported, once per run with
the launcher's process count; a missing optional extra is one line before anything heavy; the
package imports no torch until one of its names is used (torch's optimizers without torch's
compiler: tests/training/test_eager_optim.py). (How long each phase takes is measured by the
benchmark page `python -m experiments bench_startup`, not here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_bounded, run_mpi

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"

#: Run first in a child: prints a marker on stdout the moment `torch` is first imported, and makes
#: the packages named in BLOCKED look uninstalled (as a missing extra does).
WATCH = textwrap.dedent(
    """
    import importlib.abc, os, sys
    blocked = set(filter(None, os.environ.get("BLOCKED", "").split(",")))

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in blocked:
                raise ModuleNotFoundError(f"No module named {top!r}", name=top)
            if name == "torch":
                print("<torch imported>", flush=True)  # once: then it is in sys.modules
            return None

    sys.meta_path.insert(0, Watch())
    from gossip_powersgd.cli.train import main
    main(sys.argv[1:])
    """
)


def watched(*args, blocked: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, BLOCKED=blocked, OMP_NUM_THREADS="1")
    return run_bounded(
        [sys.executable, "-c", WATCH, *map(str, args)],
        timeout,
        f"gossip-train {' '.join(map(str, args))}",
        env=env,
        cwd=ROOT,
    )


def test_the_first_line_comes_before_torch_is_imported(tmp_path):
    result = watched("--config", TINY, "--set", f"out_dir={tmp_path / 'run'}", "--set", "epochs=1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "start: 1 process, loading the libraries and the config"
    assert lines[1] == "<torch imported>"
    assert lines.count("<torch imported>") == 1


@pytest.mark.parametrize(
    "setting, blocked, what, extra",
    [
        (
            "dp_noise_multiplier=1.0",
            "opacus",
            "differential privacy (dp_noise_multiplier)",
            "privacy",
        ),
        (
            "dp.target_epsilon=3",
            "dp_accounting",
            "differential privacy (dp_target_epsilon)",
            "privacy",
        ),
        ("loggers=[{wandb: {mode: offline}}]", "wandb", "loggers: wandb", "tracking"),
        ("loggers=[tensorboard]", "tensorboard", "loggers: tensorboard", "tracking"),
    ],
)
def test_a_missing_extra_is_one_line_before_torch_is_imported(
    tmp_path, setting, blocked, what, extra
):
    result = watched(
        "--config", TINY, "--set", f"out_dir={tmp_path / 'run'}", "--set", setting, blocked=blocked
    )
    assert result.returncode == 1
    assert "<torch imported>" not in result.stdout
    assert result.stderr.splitlines() == [
        f"error: {what} needs the {blocked} package, which is not installed: pip install "
        f"'gossip_powersgd[{extra}]'"
    ]
    assert not (tmp_path / "run").exists()


def test_a_missing_extra_in_the_config_file_itself_is_found(tmp_path):
    config = tmp_path / "dp.yaml"
    config.write_text(TINY.read_text() + "dp:\n  noise_multiplier: 1.0\n")
    result = watched("--config", config, "--set", f"out_dir={tmp_path / 'run'}", blocked="opacus")
    assert result.returncode == 1 and "<torch imported>" not in result.stdout
    assert "pip install 'gossip_powersgd[privacy]'" in result.stderr


def test_importing_the_package_imports_no_torch_and_every_public_name_resolves():
    code = textwrap.dedent(
        """
        import sys
        import gossip_powersgd, gossip_powersgd.training, gossip_powersgd.comm
        import gossip_powersgd.cli.train, gossip_powersgd.launch, gossip_powersgd.training.config
        assert "torch" not in sys.modules, "torch imported"
        from gossip_powersgd import *  # noqa
        from gossip_powersgd.training import *  # noqa
        from gossip_powersgd.comm import *  # noqa
        from gossip_powersgd import PowerGossip, run, LocalCluster, NonFiniteError, RunResult
        from gossip_powersgd.algorithms import PowerGossip as home
        from gossip_powersgd.comm.base import AgreementError as raised_by_comm
        assert PowerGossip is home and gossip_powersgd.AgreementError is raised_by_comm
        for package in (gossip_powersgd, gossip_powersgd.training, gossip_powersgd.comm):
            assert set(package.__all__) <= set(dir(package))
            missing = [n for n in package.__all__ if getattr(package, n, None) is None]
            assert not missing, missing
        try:
            gossip_powersgd.NoSuchName
        except AttributeError as exc:
            assert "NoSuchName" in str(exc)
        else:
            raise AssertionError("no AttributeError")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.stdout.strip() == "ok", result.stderr


@pytest.mark.mpi
def test_mpiexec_prints_one_start_line_with_its_process_count(tmp_path):
    result = run_mpi(
        2,
        ["-m", "gossip_powersgd.cli.train", "--config", TINY]
        + ["--set", "topology=ring:2", "--set", "backend=mpi", "--set", "epochs=1"]
        + ["--set", f"out_dir={tmp_path / 'run'}"],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    starts = [line for line in result.stdout.splitlines() if line.startswith("start:")]
    assert starts == ["start: 2 processes, loading the libraries and the config"]
    assert result.stdout.splitlines()[0] == starts[0]


@pytest.mark.torchrun
def test_torchrun_prints_one_start_line_with_its_process_count(tmp_path):
    from tests.comm.test_torch import run_torchrun

    result = run_torchrun(
        2,
        ["-m", "gossip_powersgd.cli.train", "--config", TINY]
        + ["--set", "topology=ring:2", "--set", "backend=torch", "--set", "epochs=1"]
        + ["--set", f"out_dir={tmp_path / 'run'}"],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    starts = [line for line in result.stdout.splitlines() if line.startswith("start:")]
    assert starts == ["start: 2 processes, loading the libraries and the config"]
    assert sum(line.startswith("set-up: libraries") for line in result.stdout.splitlines()) == 1
    # the recorded command is torchrun's own command line (here python -m torch.distributed.run)
    origin = json.loads((tmp_path / "run" / "summary.json").read_text())["provenance"]
    assert origin["launcher"] == "torchrun"
    assert origin["command"][1:3] == ["-m", "torch.distributed.run"]
    assert (
        "--nproc-per-node" in origin["command"] and "gossip_powersgd.cli.train" in origin["command"]
    )
