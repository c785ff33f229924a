"""What rank 0 prints to stdout without a terminal (a launcher's pipe, a log file): set-up lines
with their times, then plain progress lines; nothing of it with --quiet."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


def launch(tmp_path, *extra):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gossip_powersgd.cli.train",
            "--config",
            str(TINY),
            "--set",
            f"out_dir={tmp_path / 'run'}",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def test_without_a_terminal_rank_0_prints_set_up_and_progress_lines(tmp_path):
    result = launch(tmp_path)  # stderr is a pipe here, as under mpiexec or torchrun
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # stderr stays for errors: a failing run's is its one-line error
    lines = result.stdout.splitlines()
    assert lines[0] == "start: 1 process, loading the libraries and the config"
    setup = [line for line in lines if line.startswith("set-up: ")]
    assert [re.sub(r" \(\d+\.\d s\)$", "", line) for line in setup] == [
        "set-up: libraries and config loaded",
        "set-up: config checked: 4 peers agree on it",
        "set-up: data synthetic_logreg:d=20,classes=4,n=2000 loaded, partition iid",
        "set-up: model logreg (84 parameters) and powergossip:rank=1 built",
    ]
    steps = [
        int(m.group(1))
        for m in (re.match(r"progress: step (\d+)/39 \(\d+ %\)", line) for line in lines)
        if m
    ]
    # 3 epochs of 13 steps: a line after the first, every ceil(39 / 10) = 4 steps and at the
    # last one (a line that a slow machine adds after 60 s would only add steps to the list)
    assert set(range(4, 39, 4)) | {39} <= set(steps) and steps == sorted(steps)
    assert steps[0] == 1  # a line once the first step is done: training has started
    assert "steps/s" in lines[-1] or any("steps/s" in line for line in lines)


def test_quiet_prints_no_set_up_or_progress_lines(tmp_path):
    result = launch(tmp_path, "--quiet")
    assert result.returncode == 0, result.stderr
    assert not [
        line
        for line in result.stdout.splitlines()
        if line.startswith(("start:", "set-up:", "progress:"))
    ]
