"""experiments/engine: resumable rows (a sweep killed mid-way resumes by key without redoing a
finished row), the one process pool (costliest first, rows in plan order with --jobs 2), a
corrupt or partial row refused in one line naming its file and line, and `python -m experiments`'s
one-line errors on bad input. The page here (tests/support/engine_pages.py) makes its rows without
training; the real pages: tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.engine import Page, Record, RowFile, Run, merge, render, run_pool, sweep
from experiments.engine.cli import main
from experiments.engine.pool import MAX_JOBS

import engine_pages
from engine_pages import PAGE, registry

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


def test_a_killed_sweep_resumes_by_key_without_redoing_a_finished_row(tmp_path, monkeypatch):
    log = tmp_path / "started.log"
    env = dict(os.environ, ENGINE_TEST_LOG=str(log), ENGINE_TEST_KILL="k2")
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT)])
    script = textwrap.dedent(
        f"""
        from engine_pages import PAGE
        from experiments.engine import sweep
        sweep(PAGE, {str(tmp_path / "out")!r}, jobs=1)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=120)
    assert done.returncode == -9  # SIGKILL in the middle of run k2
    rows = tmp_path / "out" / "engine-test.jsonl"
    assert _keys(rows) == ["k0", "k1"]  # whole lines only: k2's row was never half-written
    monkeypatch.setenv("ENGINE_TEST_LOG", str(log))
    sweep(PAGE, tmp_path / "out", jobs=1)
    assert log.read_text().split() == ["k0", "k1", "k2", "k2", "k3", "k4"]
    assert _keys(rows) == ["k0", "k1", "k2", "k3", "k4"]
    page = (tmp_path / "out" / "engine-test.md").read_text()
    assert page == "0 0\n1 1\n2 4\n3 9\n4 16\n"
    sweep(PAGE, tmp_path / "out", jobs=1)  # nothing left to make
    assert len(log.read_text().split()) == 6


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


def test_a_serial_page_times_its_runs_one_at_a_time_whatever_jobs_says(tmp_path, capsys):
    import dataclasses

    serial = dataclasses.replace(PAGE, serial=True)
    sweep(serial, tmp_path, jobs=2)
    records = RowFile(tmp_path / "engine-test.jsonl").read()
    assert list(records) == ["k0", "k1", "k2", "k3", "k4"]  # in plan order, here, one by one
    assert all(r.row["pid"] == os.getpid() for r in records.values())
    assert "times its runs: one at a time (--jobs 2 ignored)" in capsys.readouterr().err


def test_a_worker_that_dies_is_one_line_and_the_next_sweep_finishes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ENGINE_TEST_KILL", "k3")
    code, err = _cli(["engine-test", "--jobs", "2", "--out", str(tmp_path)], capsys)
    assert code == 1 and len(err) == 1 and "a worker process died" in err[0]
    monkeypatch.delenv("ENGINE_TEST_KILL")
    assert _cli(["engine-test", "--jobs", "2", "--out", str(tmp_path)], capsys)[0] == 0
    assert _keys(tmp_path / "engine-test.jsonl") == ["k0", "k1", "k2", "k3", "k4"]


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


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"key": "k1", "config": {"i": 1', ":2: not a JSON row"),  # a write cut short
        ('{"key": "k1", "config": {}, "seed": 1}\n', ":2: the row has no 'quick'"),
        ('["k1"]\n', ":2: a row must be a JSON object"),
        (_line("k0", 0), ":2: run 'k0' is already at "),
    ],
)
def test_a_corrupt_partial_or_repeated_row_is_refused_in_one_line(tmp_path, capsys, bad, message):
    path = _stored(tmp_path, [_line("k0", 0), bad])
    for argv in (["--render-only"], []):
        code, err = _cli(["engine-test", *argv, "--out", str(tmp_path)], capsys)
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith(f"error: {path}{message}"), err
    assert path.read_text().startswith(_line("k0", 0))  # nothing rewritten


def test_a_row_made_from_another_config_is_refused(tmp_path, capsys):
    path = _stored(tmp_path, [_line("k0", 0), _line("k1", 7)])
    code, err = _cli(["engine-test", "--render-only", "--out", str(tmp_path)], capsys)
    assert code == 1 and len(err) == 1
    assert f"{path}:2: run 'k1' was made from another config than the plan's (i 7 -> 1)" in err[0]
    _stored(tmp_path, [_line("k0", 0, seed=3)])
    assert "(seed 3 -> 10)" in _cli(["engine-test", "--out", str(tmp_path)], capsys)[1][0]


def test_render_only_draws_a_partial_page_and_refuses_no_rows_or_mixed_modes(tmp_path, capsys):
    _stored(tmp_path, [_line("k1", 1), _line("k0", 0)])
    render(PAGE, tmp_path)
    assert (tmp_path / "engine-test.md").read_text() == "partial: 2 of 5\n0 0\n1 1\n"
    _stored(tmp_path, [])
    code, err = _cli(["engine-test", "--render-only", "--out", str(tmp_path)], capsys)
    assert code == 1 and "has no rows: make them first with `python -m experiments" in err[0]
    _stored(tmp_path, [_line("k0", 0), _line("k1", 1, quick=True)])
    code, err = _cli(["engine-test", "--render-only", "--out", str(tmp_path)], capsys)
    assert code == 1 and "mixes rows of --quick and full runs" in err[0]
    _stored(tmp_path, [_line("k0", 0)])
    code, err = _cli(["engine-test", "--quick", "--out", str(tmp_path)], capsys)
    assert code == 1 and "holds rows of full runs, and this is a --quick sweep" in err[0]


def test_merge_joins_sweeps_and_refuses_a_run_in_two_files(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(_line("k0", 0) + _line("k3", 3))
    b.write_text(_line("k1", 1))
    merge(PAGE, tmp_path / "out", [b, a])
    assert _keys(tmp_path / "out" / "engine-test.jsonl") == ["k0", "k1", "k3"]
    b.write_text(_line("k1", 1) + _line("k3", 3))
    code, err = _cli(["engine-test", "--merge", str(a), str(b), "--out", str(tmp_path)], capsys)
    assert code == 1 and len(err) == 1
    assert f"run 'k3' is in {a}:2 and in {b}:2: keep it in one of them" in err[0]


def test_a_plan_with_a_run_twice_is_refused(tmp_path):
    twice = Page(
        "twice", "", lambda quick, rows: [Run("k", {}), Run("k", {})], PAGE.row, PAGE.render
    )
    with pytest.raises(ValueError, match="page twice: the plan has run 'k' twice"):
        sweep(twice, tmp_path)


@pytest.mark.parametrize("jobs", ["0", "-1", "abc", "1.5", "2e3", str(10**18), str(MAX_JOBS + 1)])
def test_bad_jobs_is_one_line_and_exit_2(tmp_path, capsys, jobs):
    code, err = _cli(["engine-test", "--jobs", jobs, "--out", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: argument --jobs: "), err
    assert not (tmp_path / "engine-test.jsonl").exists()


def test_unknown_page_and_unwritable_out_are_one_line(tmp_path, capsys):
    code, err = _cli(["nope"], capsys)
    assert code == 1 and err == [
        "error: unknown page 'nope'; pages: engine-test (python -m experiments --list)"
    ]
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, text in ((afile, "is a file, not a folder"), (afile / "sub", "not a folder")):
        code, err = _cli(["engine-test", "--out", str(out)], capsys)
        assert code == 1 and len(err) == 1 and f"--out {out}" in err[0] and text in err[0]


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write: mode 0555, or for root (whom modes do not stop) the
    immutable attribute or a read-only tmpfs, whichever this machine allows."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        yield folder
        subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("root here can neither set the immutable attribute nor mount a tmpfs")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_out_is_one_line(read_only_folder, capsys):
    for argv in ([], ["--render-only"]):
        code, err = _cli(["engine-test", *argv, "--out", str(read_only_folder)], capsys)
        assert code == 1 and len(err) == 1
        assert err[0].startswith(f"error: --out {read_only_folder} is not a folder this process")


def test_no_page_or_list_lists_the_pages(capsys):
    for argv in ([], ["--list"]):
        assert main(argv, registry) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[1] == "  engine-test  a page for the engine's tests"


def test_the_pool_runs_in_order_in_process_and_raises_a_task_error():
    seen = []
    assert run_pool(pow, [(2, 3), (3, 2)], 1, done=lambda i, r: seen.append((i, r))) == [8, 9]
    assert seen == [(0, 8), (1, 9)]
    with pytest.raises(ValueError, match="math domain error"):
        run_pool(__import__("math").sqrt, [(4.0,), (-1.0,), (9.0,)], 2)
    with pytest.raises(ValueError, match="jobs must be a whole number from 1"):
        run_pool(pow, [(2, 3)], 0)
