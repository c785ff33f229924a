"""Helpers of the engine's test files (tests/experiments/engine/test_*.py): `python -m
experiments` on the test page's registry (tests/support/engine_pages.py, whose rows are made
without training), the keys of a rows file, stored rows written by hand, and the tasks of the
interrupted pool's and the killed workers' tests (module-level: worker processes import them by name)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from experiments.engine import Record
from experiments.engine.cli import main
from experiments.engine.pool import _start_worker

import engine_pages
from engine_pages import registry


SUPPORT = Path(engine_pages.__file__).resolve().parent
ROOT = SUPPORT.parents[1]


def _cli(argv, capsys):
    """(exit status, stderr lines but the progress lines) of `python -m experiments ARGV` on the
    test page's registry."""
    try:
        code = main(argv, registry)
    except SystemExit as exc:  # argparse's exit on a bad command line
        code = exc.code
    lines = capsys.readouterr().err.strip().splitlines()
    return code, [line for line in lines if not line.startswith("[experiments ")]


def _keys(path: Path):
    return [json.loads(line)["key"] for line in path.read_text().splitlines()]


def _stored(tmp_path, lines):
    (tmp_path / "engine-test.jsonl").write_text("".join(lines))
    return tmp_path / "engine-test.jsonl"


def _line(key, i, seed=None, quick=False, **row):
    record = Record(
        key, {"i": i, "pause": engine_pages.SHAPE[int(key[1:])][1]},
        10 + i if seed is None else seed, quick,
        dict({"i": i, "square": i * i, "seed": 10 + i, "pid": 0}, **row),
        "abc1234", "2026-12-04 12:00 UTC", 1.0,
    )  # fmt: skip
    return record.to_line()


def _interrupted_pool_task(folder: str, seconds: float) -> float:
    """A task of the interrupted pool's test. The quick one (`seconds` 0) returns once a long one
    has started (its `started-PID` file exists), so that the interrupt its result stands for finds
    one running; it gives up after 10 minutes (the test then fails on the missing file instead of
    hanging). A long one writes `started-PID`, sleeps `seconds`, then writes `finished-PID`,
    which therefore exists only if the task ran to its end (nobody killed its worker)."""
    if seconds == 0:
        deadline = time.monotonic() + 600
        while not any(Path(folder).glob("started-*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        return seconds
    (Path(folder) / f"started-{os.getpid()}").touch()
    time.sleep(seconds)
    (Path(folder) / f"finished-{os.getpid()}").touch()
    return seconds


def _joined_then_idle(parent: int, workers) -> None:
    """A pool worker that has joined its pool's record, then idles (10 minutes) before any task."""
    _start_worker(parent, workers)
    time.sleep(600)
