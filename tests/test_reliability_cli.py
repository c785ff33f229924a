"""Reliability of the command lines around the library: `python -m topologies show` and
`python -m experiments.consensus` on bad or oversized input (rows 29- of the table in
test_reliability's docstring; `python -m experiments`'s own: tests/test_engine.py). Each case is one line naming the
problem and the fix, a non-zero exit, no traceback, and no hang: the subprocesses run under a
timeout, and what must be refused is refused before the work it would waste."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import topologies
from topologies import __main__ as show_cli

from conftest import ROOT, SUPPORT, TESTS, run_bounded


def run_module(*args, timeout: float = 90) -> subprocess.CompletedProcess:
    """`python ARGS...` from the repository root; a run past `timeout` is killed and fails the test
    as a hang (the refusals below answer in about a second)."""
    env = dict(
        os.environ,
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
        PYTHONPATH=f"{ROOT}{os.pathsep}{TESTS}{os.pathsep}{SUPPORT}",
    )
    env.pop("GOSSIP_TRACEBACK", None)
    return run_bounded(
        [sys.executable, *map(str, args)],
        timeout,
        f"python {' '.join(map(str, args))}",
        cwd=ROOT,
        env=env,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *expected: str) -> str:
    """A non-zero exit, no traceback, and exactly one stderr line containing every `expected`."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode not in (0, None), (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert all(e in lines[0] for e in expected), lines[0]
    return lines[0]


# ---- python -m topologies show ------------------------------------------------------------------


def test_show_of_a_4096_peer_schedule_answers_without_the_dense_products():
    # It printed nothing for minutes: every step's dense W, the union's n²/2 edges as Python
    # objects, 8 products of 4096x4096 matrices and an SVD. Now the counts come from the degrees
    # and the steps' edge arrays, and the product gap says why it is not computed.
    r = run_module("-m", "topologies", "show", "matchings:4096", timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"union edges               {4096 * 4095 // 2}\n" in r.stdout  # every pair can be drawn
    assert "union degrees             4095\n" in r.stdout
    assert all(f"step {t}                    2048 edges, degrees 1\n" in r.stdout for t in range(8))
    assert "product gap (steps 0..7)  not computed: 8 dense 4096x4096 products" in r.stdout
    assert "use fewer peers to see it" in r.stdout


@pytest.mark.parametrize(
    "spec",
    [
        "matchings:16:3",
        "edge_sampling:complete:12:0.5",
        "edge_sampling:torus:4x4:0.3:2",
        "one_peer_exponential:8",
        "directed_exponential:8",
        "cyclic:ring:8,star:8",
    ],
)
def test_show_counts_each_step_from_its_edges_as_its_graph_has_them(spec):
    # The step rows no longer build each step's W: the counts from the edge arrays must be the
    # built graph's, edge for edge.
    schedule = topologies.parse(spec)
    for t in range(6):
        step = schedule.at(t)
        degrees = step.out_degrees if schedule.is_directed else step.degrees
        assert show_cli._step_counts(schedule, t) == (len(step.edges()), tuple(degrees))


def test_show_bounds_the_product_gap_before_computing_it(monkeypatch, capsys):
    def refuse(*args):
        raise AssertionError("product_gap ran above the bound")

    monkeypatch.setattr(show_cli, "product_gap", refuse)
    # (8 + 10) · 64³ multiply-adds is above a bound of 2 · 64³: 2 - 10 < 1 step fits, so the fix
    # is fewer peers; with a bound of 12 · 64³, 2 steps fit.
    monkeypatch.setattr(show_cli, "PRODUCT_GAP_WORK", 2 * 64**3)
    assert show_cli.main(["show", "edge_sampling:complete:64:0.5"]) == 0
    out = capsys.readouterr().out
    assert "product gap (steps 0..7)  not computed: 8 dense 64x64 products" in out
    assert "use fewer peers to see it" in out
    monkeypatch.setattr(show_cli, "PRODUCT_GAP_WORK", 12 * 64**3)
    assert show_cli.main(["show", "matchings:64", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "product gap (steps 0..2)  not computed" in out and "pass --steps 2 or fewer" in out


def test_show_refuses_an_absurd_number_of_steps_at_once():
    # --steps 100000000 built and multiplied a hundred million steps: it never answered.
    r = run_module("-m", "topologies", "show", "matchings:16", "--steps", "100000000", timeout=60)
    assert_one_line_error(r, "--steps must be in 1..10000, got 100000000", "use e.g. --steps 64")
    assert r.returncode == 2 and r.stdout == ""


def test_show_refuses_to_draw_more_edges_than_it_can(tmp_path, capsys):
    # The union of matchings:256 is the complete graph: 32640 edges, each a matplotlib object.
    png = tmp_path / "union.png"
    assert show_cli.main(["show", "matchings:256", "--png", str(png)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not png.exists()
    (line,) = captured.err.strip().splitlines()
    assert "--png draws at most 20000 edges and 'union(matchings:256)' has 32640" in line
    assert "drop --png or draw a smaller graph" in line


# ---- python -m experiments.consensus ------------------------------------------------------------

# Each case used to run (some of) the experiment first, or silently change what it runs.
CONSENSUS_CASES = {
    "huge spectral": (
        ["--problem", "spectral:alpha=1,n=5000"],
        ["problem 'spectral:alpha=1,n=5000' gives every peer 2.5e+07 floats", "n=1000"],
    ),
    "nan budget": (
        ["--budgets", "1e5", "nan"],
        ["--budgets must be finite and > 0, got nan", "e.g. --budgets 1e5 1e6 1e7"],
    ),
    "infinite gamma": (["--gammas", "inf"], ["--gammas must be finite and > 0, got inf"]),
    "stop-relative above 1": (
        ["--stop-relative", "2"],
        [
            "--stop-relative must be in (0, 1), got 2",
            "fraction of the initial error",
            "e.g. --stop-relative 1e-12",
        ],
    ),
    "negative sweep bits": (
        ["--sweep-bits", "-5"],
        ["--sweep-bits must be >= 0", "got -5", "e.g. --sweep-bits 1e6"],
    ),
    "absurd steps": (
        ["--steps", "100000000"],
        ["--steps must be in 1..100000, got 100000000", "use e.g. --steps 1000"],
    ),
    "bad last spec": (
        ["--algorithms", "exact", "powergossip:rank=0"],
        ["rank must be an integer >= 1, got 0"],
    ),
    "output is a file": (
        ["--out", "FILE"],
        ["cannot write to FILE: it exists and is not a directory; choose a writable --out"],
    ),
}


@pytest.fixture
def consensus_without_runs(monkeypatch):
    """experiments.consensus's main, in this process, failing the test if a run begins."""
    from experiments.consensus import cli, driver

    def no_run(*args, **kwargs):
        raise AssertionError("a run began before the arguments were checked")

    monkeypatch.setattr(driver, "consensus_curve", no_run)
    monkeypatch.setattr(driver, "matched_ratio", no_run)
    return cli.main


@pytest.mark.parametrize("case", sorted(CONSENSUS_CASES))
def test_consensus_cli_refuses_bad_arguments_before_any_run(tmp_path, consensus_without_runs, case):
    # ValueError is one of the launcher's expected errors: `main_guard` prints its one line and
    # exits 1, as the subprocess tests below see.
    argv, expected = CONSENSUS_CASES[case]
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    out = tmp_path / "out"
    argv = [str(blocker) if a == "FILE" else a for a in argv]
    expected = [e.replace("FILE", str(blocker)) for e in expected]
    with pytest.raises(ValueError) as info:
        consensus_without_runs(
            ["--steps", "2", "--algorithms", "exact", "--no-plot", "--out", str(out), *argv]
        )
    line = str(info.value)
    assert "\n" not in line and all(e in line for e in expected), line
    assert not out.exists() and blocker.read_text() == "not a directory\n"


def test_consensus_cli_huge_problem_is_one_line_before_allocating():
    # It was the allocator's traceback ("you tried to allocate 80000000000 bytes"), after the start.
    r = run_module("-m", "experiments.consensus", "--problem", "matrix:100000x100000", "--no-plot")
    assert_one_line_error(
        r,
        "error: problem 'matrix:100000x100000' gives every peer 1e+10 floats",
        "above the maximum of 4194304 (2048x2048)",
        "use e.g. matrix:1000",
    )
    assert r.stdout == ""


def test_consensus_cli_checks_its_output_directory_before_the_runs(tmp_path):
    # It ran every algorithm and then failed to write, the results lost.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    out = blocker / "out"
    r = run_module(
        "-m",
        "experiments.consensus",
        "--steps",
        "2",
        "--algorithms",
        "exact",
        "--no-plot",
        "--out",
        out,
    )
    assert_one_line_error(
        r, f"error: cannot write to {out}: Not a directory; choose a writable --out"
    )
    assert r.stdout == "", r.stdout  # not even the "consensus: ..." line of a run starting


def test_consensus_refuses_a_problem_larger_than_memory_before_allocating(
    monkeypatch, tmp_path, consensus_without_runs
):
    # 8 peers x 2048² float64 floats x (2 + degree 2) copies = 1 GiB, on a "machine" of 0.5 GiB.
    from experiments.consensus import driver

    monkeypatch.setattr(driver, "physical_memory", lambda: 2**29)
    with pytest.raises(
        ValueError,
        match=r"problem 'matrix:2048' on ring:8 needs about 1 GiB \(8 "
        r"peer\(s\) x 4194304 floats x 4 copies, float64\), more than "
        r"this machine's 0.5 GiB; use a smaller problem or topology",
    ):
        consensus_without_runs(
            ["--problem", "matrix:2048", "--out", str(tmp_path / "out"), "--no-plot"]
        )
    assert not (tmp_path / "out").exists()


# ---- the shared check ---------------------------------------------------------------------------


def test_check_writable_dir_makes_the_directory_and_leaves_nothing_in_it(tmp_path):
    from gossip_powersgd.utils import check_writable_dir

    target = tmp_path / "a" / "b"
    assert check_writable_dir(target) == target and target.is_dir() and not any(target.iterdir())
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"cannot write to .*f/c: Not a directory; pick another"):
        check_writable_dir(tmp_path / "f" / "c", "pick another")
