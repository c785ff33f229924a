"""Tests for topologies.__main__, `python -m topologies show`: the summary of a topology or a
schedule (and its drawing), in process and as a subprocess; and the reliability of the command on
bad or oversized input (`python -m experiments`'s own: tests/experiments/engine/test_cli.py).
Each refusal is one line naming the problem and the fix, a non-zero exit, no traceback, and no
hang: the subprocesses run under a timeout, and what must be refused is refused before the work it
would waste."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import topologies
from topologies import __main__ as show_cli

from tests.conftest import ROOT, SUPPORT, run_bounded
from tests.topologies._support import REPO, _run


def run_module(*args, timeout: float = 90) -> subprocess.CompletedProcess:
    """`python ARGS...` from the repository root; a run past `timeout` is killed and fails the test
    as a hang (the refusals below answer in about a second)."""
    env = dict(
        os.environ,
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
        PYTHONPATH=f"{ROOT}{os.pathsep}{SUPPORT}",
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


def _show(*args):
    return subprocess.run(
        [sys.executable, "-m", "topologies", "show", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, MPLBACKEND="Agg"),
        timeout=120,
    )


# --- python -m topologies show -------------------------------------------------------------------


def test_cli_show_prints_summary_and_writes_png(tmp_path):
    png = tmp_path / "torus.png"
    r = _run("-m", "topologies", "show", "torus:4x4", "--png", str(png))
    assert r.returncode == 0, r.stderr
    assert "spectral gap 0.4" in r.stdout
    assert "size         16" in r.stdout and "degrees      4" in r.stdout
    assert topologies.torus(4, 4).fingerprint in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["torus.png"]  # no temp file left behind


def test_cli_bad_spec_is_one_line_exit_2():
    r = _run("-m", "topologies", "show", "moebius:8")
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "topology spec 'moebius:8': unknown name 'moebius'" in r.stderr


def test_cli_in_process(capsys, tmp_path):
    from topologies.__main__ import main

    assert main(["show", "ring", "-n", "8", "--weights", "uniform"]) == 0
    out = capsys.readouterr().out
    assert "gamma        1.30839" in out and "weights      uniform" in out
    assert main(["show", "star:5", "--weights", "uniform"]) == 2
    assert "use weights='metropolis'" in capsys.readouterr().err
    assert main(["show", f"file:{tmp_path / 'missing.txt'}"]) == 2
    assert "No such file" in capsys.readouterr().err


# --- python -m topologies show of a schedule -----------------------------------------------------


def test_cli_show_describes_a_schedule():
    r = _show("one_peer_exponential:16")
    assert r.returncode == 0, r.stderr
    assert "period                    4\n" in r.stdout
    assert "union edges               32" in r.stdout and "union degrees             4" in r.stdout
    assert all(f"step {t}                    8 edges, degrees 1" in r.stdout for t in range(4))
    assert "product gap (one period)  1.0" in r.stdout
    assert topologies.one_peer_exponential(16).fingerprint in r.stdout


def test_cli_show_random_and_directed_schedules(capsys, tmp_path):
    from topologies.__main__ import main

    assert main(["show", "matchings:8", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "none (random)" in out and "step 2 " in out and "step 3 " not in out
    assert "product gap (steps 0..2)" in out
    assert main(["show", "directed_exponential:8"]) == 0
    out = capsys.readouterr().out
    assert "directed" in out and "yes" in out and "product gap (one period)  1.0" in out
    png = tmp_path / "union.png"
    assert main(["show", "one_peer_exponential:8", "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["show", "directed_exponential:8", "--png", str(png)]) == 2
    assert "undirected graphs only" in capsys.readouterr().err


def test_cli_bad_schedule_is_one_line_exit_2():
    r = _show("one_peer_exponential:12")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "power of two" in r.stderr


# --- python -m topologies show: bad or oversized input -------------------------------------------


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
