"""experiments/engine/pool.py: the one process pool. With one job the tasks run here, in order;
with --jobs 2 in worker processes, the costliest first, each result handed over as its task
finishes (a sweep stores each row then) and the rows in plan order; the workers end with the
sweep's process; a task's error is raised here and a worker that dies is one line, after which
the next sweep finishes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.engine import RowFile, run_pool, sweep
from experiments.engine.pool import _start_worker, _Workers

from engine_pages import PAGE
from tests.experiments.engine._support import ROOT, SUPPORT, _cli, _interrupted_pool_task, _keys
from tests.experiments.engine._support import _joined_then_idle


def test_with_jobs_2_each_row_is_stored_as_its_run_finishes(tmp_path):
    """k0 starts once k3 or k4 (the costliest, started first) has finished; it waits until the
    file holds both their rows, then kills the sweep. A pool that handed rows over only at the
    end would leave the file empty (k0 gives up waiting after a minute). The workers end with
    the sweep's process (before, they stayed, waiting for work, after every such test)."""
    rows = tmp_path / "engine-test.jsonl"
    env = dict(os.environ, ENGINE_TEST_KILL_PARENT="k0", ENGINE_TEST_WAIT_FOR="k3,k4")
    env["ENGINE_TEST_ROWS"] = str(rows)
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT)])
    script = textwrap.dedent(
        f"""
        from engine_pages import PAGE
        from experiments.engine import sweep
        if __name__ == "__main__":
            sweep(PAGE, {str(tmp_path)!r}, jobs=2)
        """
    )
    (tmp_path / "sweep.py").write_text(script)
    done = subprocess.run([sys.executable, str(tmp_path / "sweep.py")], env=env, timeout=120)
    assert done.returncode == -9
    assert {"k3", "k4"} <= set(_keys(rows)) and "k0" not in _keys(rows)
    if sys.platform.startswith("linux"):  # where a worker can ask to end with its parent
        workers = {RowFile(rows).read()[k].row["pid"] for k in ("k3", "k4")}
        deadline = time.monotonic() + 30  # a SIGKILL is sent at once; 30 s for a loaded machine
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_running, workers)), workers


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an ended one nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_jobs_2_starts_the_costliest_first_in_worker_processes_rows_in_plan_order(
    tmp_path, monkeypatch
):
    log = tmp_path / "started.log"
    monkeypatch.setenv("ENGINE_TEST_LOG", str(log))
    sweep(PAGE, tmp_path, jobs=2)
    assert set(log.read_text().split()[:2]) == {"k3", "k4"}  # cost 5 before cost 1
    records = RowFile(tmp_path / "engine-test.jsonl").read()
    assert list(records) == ["k0", "k1", "k2", "k3", "k4"]
    assert all(r.row["pid"] != os.getpid() for r in records.values())
    assert [r.seed for r in records.values()] == [10, 11, 12, 13, 14]
    assert json.loads((tmp_path / "engine-test.json").read_text()) == list(records)
    assert (tmp_path / "engine-test.md").read_text() == "0 0\n1 1\n2 4\n3 9\n4 16\n"


def test_a_worker_that_dies_is_one_line_and_the_next_sweep_finishes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ENGINE_TEST_KILL", "k3")
    code, err = _cli(["engine-test", "--jobs", "2", "--out", str(tmp_path)], capsys)
    assert code == 1 and len(err) == 1 and "a worker process died" in err[0]
    monkeypatch.delenv("ENGINE_TEST_KILL")
    assert _cli(["engine-test", "--jobs", "2", "--out", str(tmp_path)], capsys)[0] == 0
    assert _keys(tmp_path / "engine-test.jsonl") == ["k0", "k1", "k2", "k3", "k4"]


def test_the_pool_runs_in_order_in_process_and_raises_a_task_error():
    seen = []
    assert run_pool(pow, [(2, 3), (3, 2)], 1, done=lambda i, r: seen.append((i, r))) == [8, 9]
    assert seen == [(0, 8), (1, 9)]
    with pytest.raises(ValueError, match="math domain error"):
        run_pool(__import__("math").sqrt, [(4.0,), (-1.0,), (9.0,)], 2)
    with pytest.raises(ValueError, match="jobs must be a whole number from 1"):
        run_pool(pow, [(2, 3)], 0)


def test_an_interrupted_pool_kills_its_workers_instead_of_waiting_for_their_runs(tmp_path):
    """Ctrl-C arrives here (`done` raising KeyboardInterrupt stands for it) once a worker runs a
    long task: the pool ends with the interrupt, no long task ran to its end (each writes
    `finished-PID` only then) and the workers that started one are gone. No clock is read: the
    one margin is the 30 s a long task sleeps, in which the quick task's result, sent once a long
    one has started, must reach the pool. Before, the pool waited for the running tasks and the
    one queued behind them, then dropped their results (their `finished-PID` files existed)."""

    def done(index, result):
        raise KeyboardInterrupt

    folder = str(tmp_path)
    tasks = [(folder, 0.0), (folder, 30.0), (folder, 30.0), (folder, 30.0)]  # the quick one first
    with pytest.raises(KeyboardInterrupt):
        run_pool(_interrupted_pool_task, tasks, 2, costs=[9.0, 1.0, 1.0, 1.0], done=done)
    started = [int(p.name.split("-")[1]) for p in tmp_path.glob("started-*")]
    assert started, "no long task started: the interrupt found none running"
    assert not list(tmp_path.glob("finished-*")), "a long task ran to its end"
    assert not any(map(_running, started)), started  # joined by the pool before it returned


def test_the_pools_record_of_its_workers_kills_the_joined_ones_and_ends_the_late_ones():
    """The pool kills its workers from its own record (each worker sends its pid first thing),
    not from the executor's private `_processes`: a worker that has joined (here, then idling in
    10 minutes) is killed; one that starts after the pool began closing (Ctrl-C
    during the workers' start-up) ends by itself before taking a task, with exit status 1, and
    is not held up by the killed one (with a queue, it waited for ever on the queue's lock when
    the first was killed before releasing it)."""
    context = multiprocessing.get_context("spawn")
    workers = _Workers(context)
    joined = context.Process(target=_joined_then_idle, args=(os.getpid(), workers), daemon=True)
    joined.start()
    while not workers.pids.poll(0.1) and joined.is_alive():  # its pid sent, not read yet
        pass
    workers.kill()
    joined.join(60)  # SIGKILL ends it at once; 60 s only so a failure does not hang
    late = context.Process(target=_start_worker, args=(os.getpid(), workers), daemon=True)
    late.start()
    late.join(60)
    assert (joined.exitcode, late.exitcode) == (-signal.SIGKILL, 1)
