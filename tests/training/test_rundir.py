"""`--resume auto`: a relaunch of the very same command continues the run (torchrun
--max-restarts, a requeued batch job). A user hook named in the config fails once at a chosen
step; the relaunched command must end with the same model, bit for bit, as a run that never
failed (resume is bit-exact), and a failure before the first checkpoint starts the run again
without losing the first attempt's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gossip_powersgd.training.hooks import TrainingHooks

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


class FailOnce(TrainingHooks):
    """Raises at `step` unless `marker` exists; creates it first (so a relaunch passes)."""

    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, Path(marker)

    def after_step(self, step, loss):
        if step == self.step and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError(f"injected failure at step {step}")


def command(run_dir: Path, fail_at: int, marker: Path):
    hook = json.dumps(
        [{"tests.training.test_rundir:FailOnce": {"step": fail_at, "marker": str(marker)}}]
    )
    return [
        sys.executable,
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        str(TINY),
        "--quiet",
        "--set",
        "epochs=2",
        "--set",
        f"out_dir={run_dir}",
        "--set",
        f"hooks={hook}",
        "--resume",
        "auto",
    ]


def launch(args):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("fail_at", [16, 2], ids=["after-a-checkpoint", "before-any-checkpoint"])
def test_a_relaunch_of_the_same_command_continues_the_run(tmp_path, fail_at):
    # the same config (hooks are part of it) with the marker already there: it never fails
    (tmp_path / "never").touch()
    reference = launch(command(tmp_path / "reference", fail_at, tmp_path / "never"))
    assert reference.returncode == 0, reference.stderr
    expected = json.loads((tmp_path / "reference" / "summary.json").read_text())
    assert expected["steps_per_epoch"] == 13  # step 16 is in epoch 2, after the epoch-1 checkpoint

    args = command(tmp_path / "run", fail_at, tmp_path / "marker")
    first = launch(args)
    assert first.returncode != 0 and f"injected failure at step {fail_at}" in first.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    second = launch(args)  # the very same command
    assert second.returncode == 0, second.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model_sha256"] == expected["model_sha256"]
    assert summary["steps"] == expected["steps"] == 26
    attempts = tmp_path / "run" / "failed-attempts"
    if fail_at < expected["steps_per_epoch"]:  # no checkpoint: started again, the files kept
        assert (attempts / "1" / "metrics" / "rank-0.jsonl").is_file()
        assert "ended before its first checkpoint" in second.stderr
    else:
        assert not attempts.exists()

    # the metrics file holds every step once, as the reference's does
    def steps(run):
        lines = (tmp_path / run / "metrics" / "rank-0.jsonl").read_text().splitlines()
        return [json.loads(line)["step"] for line in lines]

    assert steps("run") == steps("reference")


def test_resume_auto_needs_a_config_to_start_from(tmp_path):
    result = launch([sys.executable, "-m", "gossip_powersgd.cli.train", "--resume", "auto"])
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --resume auto needs --config FILE or a RUN_DIR holding config.yaml"
    )
    result = launch([sys.executable, "-m", "gossip_powersgd.cli.train", "--resume", "a", "b"])
    assert result.returncode != 0 and "--resume takes RUN_DIR or auto [RUN_DIR]" in result.stderr
