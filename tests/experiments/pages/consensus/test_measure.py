"""experiments/pages/consensus/measure.py: the consensus measurements on tiny settings (bit accounting
from the transport, budget brackets, dtype and precision floor), matched-bit cells, the tuned
baselines, and the MPI transport giving the very numbers of the in-process one. The log-log
interpolation at matched bits is tested in tests/test_metrics.py, the problems' closed forms in
tests/test_consensus_problems.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

import topologies
from experiments.pages.consensus import files, measure
from gossip_powersgd import LocalCluster, metrics

from tests.conftest import run_mpi
from tests.experiments.pages.consensus._support import TINY

torch.set_num_threads(1)


PG = "powergossip:rank=1,iters=1,warm=true"


def _curve_and_bytes(comm, problem, spec, steps, budgets=measure.BUDGETS, dtype="float32"):
    outcome = measure.consensus_curve(comm, problem, spec, steps, math.inf, budgets, dtype=dtype)
    return outcome, comm.stats.bytes_sent


def _run(spec, steps=30, topology="ring:4", **kwargs):
    return LocalCluster(topologies.parse(topology)).run(
        _curve_and_bytes, TINY, spec, steps, **kwargs
    )


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
    # Sparse recording after step 20, but the last step within each budget and the first beyond
    # it are always recorded: PowerGossip rank 1 here sends 1280 bits per step, so 3e4 and 5e4
    # bits fall after steps 23 and 39.
    topo = topologies.parse("ring:4")
    args = (TINY, PG, 200, 6e4, (3e4, 5e4))
    result = LocalCluster(topo).run(measure.consensus_curve, *args)[0]
    history = result["history"]
    steps = [r["step"] for r in history]
    assert {23, 24, 39, 40} <= set(steps) and result["stop"] == "max_bits"
    assert history[-1]["bits_per_peer"] > 6e4 >= history[-2]["bits_per_peer"]
    dense = _run(PG, 39)[0][0]["history"]
    assert dense[-1]["step"] == 39 and history[steps.index(39)] == dense[-1]
    # The error at exactly 5e4 bits lies between the bracketing steps' (log-log interpolation).
    at = metrics.error_at_bits(history, 5e4)
    low, high = history[steps.index(40)]["error"], history[steps.index(39)]["error"]
    assert low <= at <= high


def test_cells_status_and_the_best_gamma_per_budget():
    history = [{"step": 0, "bits_per_peer": 0.0, "error": 100.0}]
    history += [
        {"step": s, "bits_per_peer": 300.0 * s, "error": 100.0 / (s + 1)} for s in (1, 2, 3, 5, 8)
    ]
    cells = measure.cells_for(history, (200, 300, 2400, 3000), "max_bits", "full")
    assert cells[200] == {"status": "—"}  # the first step (300 bits) already exceeds it
    # exactly at a recorded step (exp(log(y)): to rounding)
    assert cells[300]["row"]["error"] == pytest.approx(50.0, rel=1e-14)
    assert cells[2400]["row"]["error"] == pytest.approx(100.0 / 9)  # the last step, exactly
    assert cells[3000] == {"status": "not reached"}  # the run ended within the budget
    assert measure.cells_for(history, (3000,), "max_bits", "screen")[3000] == {
        "status": "screened out"
    }

    # summarize: the best gamma per budget, per algorithm; diverged runs never win.
    def result(gamma, errors, status="ok"):
        return {
            "label": "Choco sign",
            "spec": f"choco:compressor=sign,gamma={gamma}",
            "gamma": gamma,
            "swept": True,
            "reach": {t: None for t in measure.REACH_TARGETS},
            "budgets": {
                b: (
                    {
                        "status": "ok",
                        "row": {"error": e, "relative": e, "bound": False, "at_floor": False},
                    }
                    if e is not None
                    else {"status": status}
                )
                for b, e in zip((1e5, 1e6), errors)
            },
        }

    summary = measure.summarize(
        [result(0.1, [5.0, 1.0]), result(0.3, [2.0, 3.0]), result(1.0, [1.0, None], "diverged")],
        (1e5, 1e6),
    )
    best = summary["Choco sign"]["budgets"]
    assert (best[1e5]["gamma"], best[1e6]["gamma"]) == (1.0, 0.1)
    assert summary["Choco sign"]["plot_spec"] == "choco:compressor=sign,gamma=0.1"
    table = files.format_table(summary, (1e5, 1e6))
    assert "| 1 (γ=1) | 1 (γ=0.1) |" in table


def test_tuned_baselines_are_swept_and_top_k_matched():
    runs = measure.expand(["exact", "choco:compressor=topk:matched"], [0.1, 1.0], 0.05)
    assert [(r["spec"], r["swept"]) for r in runs] == [
        ("exact", False),
        ("choco:compressor=topk:0.05,gamma=0.1", True),
        ("choco:compressor=topk:0.05,gamma=1", True),
    ]
    assert not measure.expand(["choco:compressor=sign,gamma=0.3"], [0.1], None)[0]["swept"]
    with pytest.raises(ValueError, match="given twice"):
        measure.expand(["exact", "exact"], [0.1], None)


def _floor_curve(comm, spec, dtype):
    return measure.consensus_curve(
        comm, "matrix:12", spec, 400, math.inf, (1e4,), dtype=dtype, stop_at_floor=True
    )


@pytest.mark.parametrize(
    "spec",
    [
        "exact",
        "powergossip:rank=1,iters=1,warm=true",
        "choco:compressor=sign,gamma=1",
        "choco:compressor=topk:0.2,gamma=0.3",
        "deepsqueeze:compressor=lowrank:1,gamma=0.1",
    ],
)
def test_float64_state_sends_8_bytes_per_float_and_stops_at_its_floor(spec):
    cluster = LocalCluster(topologies.parse("ring:4"))
    wide = cluster.run(_floor_curve, spec, "float64")[0]
    narrow = cluster.run(_floor_curve, spec, "float32")[0]
    first = {d: r["history"][1]["bits_per_peer"] for d, r in (("64", wide), ("32", narrow))}
    if spec.startswith(("exact", "powergossip")):
        assert first["64"] == 2 * first["32"]  # the same floats, 8 bytes each instead of 4
    assert wide["floor"] == pytest.approx(narrow["floor"] * (2.0**-52 / 2.0**-23) ** 2)
    for outcome in (wide, narrow):
        last = outcome["history"][-1]["error"]
        if outcome["stop"] == "floor":
            assert last <= metrics.FLOOR_MARGIN * outcome["floor"]
        else:
            assert all(
                r["error"] > metrics.FLOOR_MARGIN * outcome["floor"] for r in outcome["history"]
            )
    if spec == "exact":  # exact gossip contracts every step: float32 reaches its floor in 400 steps
        assert (
            narrow["stop"] == "floor"
            and wide["history"][-1]["error"] < narrow["history"][-1]["error"]
        )


def _curve(points):
    return [{"step": k, "bits_per_peer": b, "error": e} for k, (b, e) in enumerate(points)]


def test_matched_cells_interpolate_at_the_budget_and_bound_early_stops():
    history = _curve([(0.0, 100.0), (10.0, 10.0), (1000.0, 0.1)])
    cells = measure.cells_for(history, (5, 100, 1000, 5000), "max_bits", "full", floor=1e-9)
    assert cells[5] == {"status": "—"}
    assert cells[100]["row"]["error"] == pytest.approx(
        1.0
    )  # log-log midpoint of (10, 10), (1000, 0.1)
    assert cells[100]["row"]["relative"] == pytest.approx(0.01) and not cells[100]["row"]["bound"]
    assert cells[5000] == {"status": "not reached"}
    stopped = measure.cells_for(history, (5000,), "reached", "full", floor=0.02)[5000]["row"]
    assert stopped["bound"] and stopped["error"] == 0.1 and stopped["at_floor"]
    assert measure.reach_cells(history) == {1e-2: pytest.approx(100.0), 1e-4: None}


MPI_SCRIPT = """
import json, math, topologies
from mpi4py import MPI
from gossip_powersgd.launch import run_peers
from experiments.pages.consensus.measure import consensus_curve
out = {}
for spec in json.loads(%r):
    values = run_peers(topologies.parse("ring:4"), consensus_curve, "matrix:20", spec, 30, math.inf, (1e4,), None, 0, "float64", backend="mpi")
    out[spec] = next(iter(values.values()))["history"]
if MPI.COMM_WORLD.rank == 0:
    print(json.dumps(out))
"""


MPI_SPECS = ["exact", PG, "choco:compressor=topk:0.05,gamma=0.3", "choco:compressor=sign,gamma=1"]


def _local_histories(comm):
    args = ("matrix:20",)
    return {
        s: measure.consensus_curve(comm, *args, s, 30, math.inf, (1e4,), None, 0, "float64")[
            "history"
        ]
        for s in MPI_SPECS
    }


@pytest.mark.mpi
def test_mpi_backend_equals_local_backend():
    result = run_mpi(4, ["-c", MPI_SCRIPT % json.dumps(MPI_SPECS)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    mpi = json.loads(result.stdout.strip().splitlines()[-1])
    local = LocalCluster(topologies.parse("ring:4")).run(_local_histories)[0]
    assert all(h[-1]["step"] == 30 for h in local.values())
    assert mpi == json.loads(json.dumps(local))  # bit-equal numbers: same steps, bits and errors
