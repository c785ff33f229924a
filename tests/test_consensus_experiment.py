"""experiments/consensus.py: the consensus experiment on a tiny setting, its bit accounting, its budget
table, and the MPI transport giving the very numbers of the in-process one."""

from __future__ import annotations

import math

import pytest
import torch

import topologies
from experiments import consensus
from gossip_powersgd import LocalCluster

from conftest import run_mpi

torch.set_num_threads(1)

TINY = "matrix:20"
PG = "powergossip:rank=1,iters=1,warm=true"


def _curve_and_bytes(comm, problem, spec, steps):
    outcome = consensus.consensus_curve(comm, problem, spec, steps, math.inf)
    return outcome, comm.stats.bytes_sent


def _run(spec, steps=30, topology="ring:4"):
    topo = topologies.parse(topology, weights="uniform")
    return LocalCluster(topo).run(_curve_and_bytes, TINY, spec, steps)


@pytest.mark.parametrize("spec", ["exact", PG])
def test_error_decreases_and_bits_are_the_transport_counters(spec):
    results = _run(spec)
    history = results[0][0]["history"]
    steps = [r["step"] for r in history]
    assert steps[:21] == list(range(21)) and steps[-1] == 30  # every early step, and the last
    errors = [r["error"] for r in history]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.5 * errors[0]
    for outcome, sent in results:
        assert outcome["history"] == history  # every peer records the same curve
        assert outcome["bytes_sent"] == sent
        assert history[-1]["bits_per_peer"] == 8 * sent
    # Cross-check against the wire formats (the experiment itself never uses a formula): 20 floats
    # (PowerGossip rank 1) or 400 floats (exact) to each of 2 neighbours per step.
    floats = 400 if spec == "exact" else 20
    assert [r["bits_per_peer"] for r in history] == [32 * 2 * floats * r["step"] for r in history]


def test_budget_boundaries_are_recorded_exactly():
    # Sparse evaluation after step 20, but the last step within each budget is always recorded.
    topo = topologies.parse("ring:4", weights="uniform")
    budgets = (3e4, 5e4)  # PowerGossip rank 1 here: 1280 bits per step -> steps 23 and 39
    results = LocalCluster(topo).run(consensus.consensus_curve, TINY, PG, 200, 6e4, budgets)
    history = results[0]["history"]
    steps = [r["step"] for r in history]
    assert 23 in steps and 39 in steps and results[0]["stop"] == "max_bits"
    assert history[-1]["bits_per_peer"] > 6e4 >= history[-2]["bits_per_peer"]
    cells = consensus.budget_rows(history, budgets)
    assert [cells[b]["row"]["step"] for b in budgets] == [23, 39]
    dense = LocalCluster(topo).run(_curve_and_bytes, TINY, PG, 39)[0][0]["history"]
    assert dense[-1]["step"] == 39 and cells[5e4]["row"] == dense[-1]


def test_budget_table_picks_the_last_row_within_each_budget():
    history = [{"step": 0, "bits_per_peer": 0.0, "error": 100.0}]
    history += [
        {"step": s, "bits_per_peer": 300.0 * s, "error": 100.0 / (s + 1)} for s in (1, 2, 3, 5, 8)
    ]
    cells = consensus.budget_rows(history, (200, 300, 1000, 1500, 2000, 2400))
    assert cells[200] == {"status": "—"}  # the first step (300 bits) already exceeds it
    assert cells[300]["row"]["step"] == 1  # exactly at the budget counts
    assert cells[1000]["row"]["step"] == 3  # 900 <= 1000 < 1500
    assert cells[1500]["row"]["step"] == 5
    assert cells[2000]["row"]["step"] == 5  # the last recorded row within the budget
    assert cells[2400] == {"status": "not reached"}  # the run ended within the budget

    # summarize: the best gamma per budget, per algorithm; diverged runs never win.
    def result(gamma, errors, status="ok"):
        return {
            "label": "Choco sign",
            "spec": f"choco:compressor=sign,gamma={gamma}",
            "gamma": gamma,
            "swept": True,
            "budgets": {
                b: ({"status": "ok", "row": {"error": e}} if e is not None else {"status": status})
                for b, e in zip((1e5, 1e6), errors)
            },
        }

    summary = consensus.summarize(
        [result(0.1, [5.0, 1.0]), result(0.3, [2.0, 3.0]), result(1.0, [1.0, None], "diverged")],
        (1e5, 1e6),
    )
    best = summary["Choco sign"]["budgets"]
    assert (best[1e5]["gamma"], best[1e6]["gamma"]) == (1.0, 0.1)
    assert summary["Choco sign"]["plot_spec"] == "choco:compressor=sign,gamma=0.1"
    table = consensus.format_table(summary, (1e5, 1e6))
    assert "1 (γ=1)" in table and "1 (γ=0.1)" in table


def test_tuned_baselines_need_gamma_or_sweep():
    with pytest.raises(ValueError, match="--sweep"):
        consensus.expand(["choco:compressor=sign"], False, [0.1], None)
    runs = consensus.expand(["choco:compressor=topk:matched"], True, [0.1, 1.0], 0.05)
    assert [r["spec"] for r in runs] == [
        "choco:compressor=topk:0.05,gamma=0.1",
        "choco:compressor=topk:0.05,gamma=1",
    ]


def test_problems():
    assert consensus.problem_shapes("matrix") == [(100, 100)]
    assert consensus.problem_shapes("cnn") == [
        (32, 1, 5),
        (32,),
        (32, 32, 5),
        (32,),
        (32, 32, 5),
        (32,),
        (10, 128),
        (10,),
    ]
    a, b = consensus.make_problem("matrix", 0), consensus.make_problem("matrix", 1)
    assert a[0].dtype == torch.float32 and not torch.equal(a[0], b[0])
    assert torch.equal(a[0], consensus.make_problem("matrix", 0)[0])


def _read(directory):
    return consensus.read_curves(directory / consensus.CURVES)


@pytest.mark.mpi
def test_mpi_backend_equals_local_backend(tmp_path):
    args = [
        "--topology",
        "ring:4",
        "--problem",
        TINY,
        "--steps",
        "30",
        "--no-plot",
        "--algorithms",
        "exact",
        PG,
        "choco:compressor=topk:0.05,gamma=0.3",
        "choco:compressor=sign,gamma=1",
    ]
    result = run_mpi(
        4,
        ["-m", "experiments.consensus", "--backend", "mpi", "--out", tmp_path / "mpi", *args],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert consensus.main(["--backend", "local", "--out", str(tmp_path / "local"), *args]) == 0
    mpi, local = _read(tmp_path / "mpi"), _read(tmp_path / "local")
    assert len(local) == 4 and all(rows[-1]["step"] == 30 for rows in local.values())
    assert mpi == local  # bit-equal numbers: same steps, bits and errors
    assert (tmp_path / "mpi" / "table.csv").read_text() == (
        tmp_path / "local" / "table.csv"
    ).read_text()
