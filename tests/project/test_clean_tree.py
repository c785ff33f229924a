"""No experiment writes into the checkout unless asked: run without --out from a fresh clone of
this checkout, a page's quick (smallest) mode, the GPU check's dry run, gossip-train and
gossip-plot leave `git status --porcelain` empty (their outputs go under runs/, which git ignores).
Committed pages are written only by an explicit `--out experiments/results...`.

Every page's quick sweep is run once, by tests/experiments/pages/test_every_page.py, which checks
that it writes nothing into the checkout beside its --out; where a page goes without --out is the
engine's one default for every page (`experiments/engine/cli.py`), checked here end to end on the
demo page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

#: A page's quick mode and the GPU check's dry run, without --out.
QUICK = [
    ["-m", "experiments", "demo", "--quick"],
    ["-m", "experiments.gpu_check", "--dry-run", "--device", "cpu"],
]


def _git(*args, cwd) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def _clone(tmp_path: Path) -> Path:
    """A clone of this checkout with the working tree's uncommitted changes committed on top (the
    test checks the code as it is, the history is there for the benchmarks that read old commits)."""
    clone = tmp_path / "clone"
    _git("clone", "-q", "--no-hardlinks", str(ROOT), str(clone), cwd=tmp_path)
    changed = _git("ls-files", "-z", "--modified", "--others", "--exclude-standard", cwd=ROOT)
    deleted = set(_git("ls-files", "-z", "--deleted", cwd=ROOT).split("\0"))
    for name in filter(None, changed.split("\0")):
        if name not in deleted:
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    for name in filter(None, deleted):
        (clone / name).unlink(missing_ok=True)
    _git("add", "-A", cwd=clone)
    _git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "tree",
        cwd=clone,
    )
    return clone


@pytest.mark.slow
def test_quick_modes_leave_a_clean_checkout(tmp_path):
    clone = _clone(tmp_path)
    assert _git("status", "--porcelain", cwd=clone) == ""
    env = {
        **os.environ,
        "PYTHONPATH": str(clone),
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }

    def run(args):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=600
        )
        return args, done, time.perf_counter() - started

    # Two at a time: most of each is single-threaded start-up and tiny runs.
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(run, QUICK))
    for args, done, _ in outcomes:
        assert done.returncode == 0, (" ".join(args), done.stderr[-2000:])
    # gossip-train's smallest example, twice, and gossip-plot of both runs without --out.
    train = [
        sys.executable,
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        "experiments/configs/tiny.yaml",
        "--set",
    ]
    for name in ("a", "b"):
        done = subprocess.run(
            [*train, f"out_dir=runs/tiny-{name}"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run(
        [sys.executable, "-m", "gossip_powersgd.cli.plot", "runs/tiny-a", "runs/tiny-b"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "writing the figures to" in done.stderr and "--out DIR" in done.stderr
    assert (clone / "runs" / "plots-tiny-a-vs-tiny-b" / "accuracy_vs_epoch.png").exists()
    # One run's plots go into its run directory.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gossip_powersgd.cli.plot",
            "runs/tiny-a",
            "--out",
            "runs/tiny-a/plots",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (clone / "runs" / "tiny-a" / "plots" / "accuracy_vs_mb.png").exists()
    page = (clone / "runs" / "experiments-quick" / "demo.md").read_text()
    assert "at commit " in page and (page.count("![") == 3)
    assert _git("status", "--porcelain", "--untracked-files=all", cwd=clone) == "", [
        (" ".join(a), f"{s:.0f} s") for a, _, s in outcomes
    ]
