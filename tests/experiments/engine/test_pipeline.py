"""experiments/engine/pipeline.py: a sweep makes only the plan's runs that have no stored row (a
sweep killed mid-way resumes by key without redoing a finished row), a serial page's runs one at a
time whatever --jobs says, a stored row made from another config refused, --render-only's page
drawn from the rows alone (partial, or refused without rows or with rows of both modes) and
--merge's join of sweeps made apart. The page here (tests/support/engine_pages.py) makes its rows
without training; the real pages: tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from experiments.engine import RowFile, merge, render, sweep

from engine_pages import PAGE
from tests.experiments.engine._support import ROOT, SUPPORT, _cli, _keys, _line, _stored


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


def test_a_serial_page_times_its_runs_one_at_a_time_whatever_jobs_says(tmp_path, capsys):
    import dataclasses

    serial = dataclasses.replace(PAGE, serial=True)
    sweep(serial, tmp_path, jobs=2)
    records = RowFile(tmp_path / "engine-test.jsonl").read()
    assert list(records) == ["k0", "k1", "k2", "k3", "k4"]  # in plan order, here, one by one
    assert all(r.row["pid"] == os.getpid() for r in records.values())
    assert "times its runs: one at a time (--jobs 2 ignored)" in capsys.readouterr().err


def test_a_row_made_from_another_config_is_refused(tmp_path, capsys):
    path = _stored(tmp_path, [_line("k0", 0), _line("k1", 7)])
    code, err = _cli(["engine-test", "--render-only", "--out", str(tmp_path)], capsys)
    assert code == 1 and len(err) == 1
    assert f"{path}:2: run 'k1' was made from another config than the plan's (i 7 -> 1)" in err[0]
    _stored(tmp_path, [_line("k0", 0, seed=3)])
    assert "(seed 3 -> 10)" in _cli(["engine-test", "--out", str(tmp_path)], capsys)[1][0]


def test_the_command_named_for_missing_rows_makes_them_where_they_are_looked_for(tmp_path):
    """Rows missing from the quick sweeps' default folder are made by a --quick sweep (the hint
    named the bare command, which makes full rows in the other default folder); elsewhere --out
    names the folder."""
    from experiments.engine.pipeline import default_out, sweep_command

    assert sweep_command("p", default_out(False)) == "python -m experiments p"
    assert sweep_command("p", default_out(True)) == "python -m experiments p --quick"
    assert sweep_command("p", tmp_path) == f"python -m experiments p --out {tmp_path}"


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


def test_render_only_refuses_rows_of_no_planned_run_and_keeps_the_page(tmp_path, capsys):
    """Rows whose keys are all outside the plan (renamed runs, another page's rows) left the
    renderer no row: a page of nothing replaced the one there with exit 0 (a real page's renderer
    failed with a traceback instead). Refused now, naming the command that makes the plan's rows;
    the page there is kept."""
    _stored(tmp_path, [_line("k0", 0, quick=True)])
    render(PAGE, tmp_path)
    page = (tmp_path / "engine-test.md").read_text()
    (tmp_path / "engine-test.jsonl").write_text(_line("k0", 0, quick=True).replace('"k0"', '"x0"'))
    code, err = _cli(["engine-test", "--render-only", "--out", str(tmp_path)], capsys)
    assert code == 1 and len(err) == 1
    assert "has none of the plan's 3 run(s), only rows of runs not in it" in err[0]
    assert f"`python -m experiments engine-test --quick --out {tmp_path}`" in err[0]
    assert (tmp_path / "engine-test.md").read_text() == page


def test_merge_into_the_folder_of_one_of_its_sources_reads_that_file_once(tmp_path, capsys):
    """`--merge a/PAGE.jsonl b/PAGE.jsonl --out a` (join b's rows into a's) was refused: a's file
    was read as --out's rows and again as a source, every run of it "in a/PAGE.jsonl:1 and in
    a/PAGE.jsonl:1". A folder given for a rows file is named as such."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "engine-test.jsonl").write_text(_line("k0", 0) + _line("k3", 3))
    (b / "engine-test.jsonl").write_text(_line("k1", 1))
    argv = ["engine-test", "--merge", str(a / "engine-test.jsonl"), str(b / "engine-test.jsonl")]
    assert _cli(argv + [str(a / "engine-test.jsonl"), "--out", str(a)], capsys) == (0, [])
    assert _keys(a / "engine-test.jsonl") == ["k0", "k1", "k3"]
    code, err = _cli(["engine-test", "--merge", str(b), "--out", str(a)], capsys)
    assert (code, err) == (
        1,
        [f"error: --merge {b} is a folder: give its rows file ({b}/engine-test.jsonl)"],
    )
