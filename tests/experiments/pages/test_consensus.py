"""experiments/pages/consensus: the consensus measurements on tiny settings (bit accounting from
the transport, budget brackets, dtype and precision floor), matched-bit cells, the winner map, one
instance run and drawn from its row, the trained-models problem read back, and the MPI transport
giving the very numbers of the in-process one. The log-log interpolation at matched bits is
tested in tests/test_metrics.py, the problems' closed forms in tests/test_consensus_problems.py."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch

import topologies
from experiments.engine import Record, Run
from experiments.pages import consensus as page
from experiments.pages.consensus import files, instance, measure
from gossip_powersgd import LocalCluster, metrics
from gossip_powersgd import consensus_problems as problems

from tests.conftest import run_mpi

torch.set_num_threads(1)

TINY = "matrix:20"
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


def test_the_plan_is_the_pages_25_instances():
    runs = page.plan(False, {})
    assert (
        len(runs) == 25
        and runs[0].key == "ring:8/matrix"
        and runs[-1].key == "torus:4x4/offset:beta=10"
    )
    models = [r for r in runs if r.config["problem"].startswith("models:")]
    assert len(models) == 3 and all(r.config["seeds"] == [0] for r in models)
    full = [r.key for r in runs if r.config["reseed"] is not None]
    assert full == ["ring:8/matrix", "ring:8/cnn", "torus:4x4/matrix"]


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


def _result(label, spec, seed, relative, reach=None, gamma=None, swept=False):
    row = {
        "bits_per_peer": 1e5,
        "error": relative * 10,
        "relative": relative,
        "bound": False,
        "at_floor": False,
    }
    cells = {1e5: {"status": "ok", "row": row}}
    return {
        "label": label,
        "spec": spec,
        "seed": seed,
        "gamma": gamma,
        "swept": swept,
        "budgets": cells,
        "reach": {1e-2: reach, 1e-4: None},
    }


def test_winner_map_takes_means_over_seeds_and_flags_disagreeing_seeds():
    results = [
        _result("PowerGossip r1", "pg", s, e, reach=b)
        for s, e, b in ((0, 1.0, 10.0), (1, 1.0, 30.0), (2, 1.0, 20.0))
    ]
    results += [
        _result("Choco sign", f"choco,gamma={g}", 0, e, gamma=g, swept=True, reach=5.0)
        for g, e in ((0.1, 5.0), (1.0, 0.5))
    ]
    results += [
        _result("Choco sign", "choco,gamma=1.0", s, e, gamma=1.0, swept=True, reach=5.0)
        for s, e in ((1, 1.9), (2, 0.5))
    ]
    summary = measure.summarize([r for r in results if r["seed"] == 0], (1e5,))
    record = {"summary": summary, "results": results, "budgets": [1e5]}
    cell = files.winner_cell(record, "budget", 1e5)
    assert cell["winner"] == "Choco sign" and cell["runner_up"] == "PowerGossip r1"
    assert cell["margin"] == pytest.approx(
        1.0 / ((0.5 + 1.9 + 0.5) / 3)
    )  # Choco at gamma=1 on seed 0 too
    assert cell["spread"] == (pytest.approx(1 / 1.9), pytest.approx(2.0)) and cell["disagree"] == [
        1
    ]
    reach = files.winner_cell(record, "reach", 1e-2)
    assert reach["winner"] == "Choco sign" and reach["margin"] == pytest.approx(20.0 / 5.0)
    assert "seed 1" in files.winner_text(cell)
    assert files.powergossip_ratio(record, "reach", 1e-2) == pytest.approx(4.0)


def test_models_problem_reads_the_saved_epochs(tmp_path):
    from experiments.pages.consensus.instance import SaveAtEpochs

    model = torch.nn.Linear(3, 2)
    hook = SaveAtEpochs((1, 3))
    hook.setup(type("Context", (), {"model": model, "steps_per_epoch": 2})())
    snapshots = {}
    for step in range(6):
        with torch.no_grad():
            model.weight.add_(1.0)
        hook.after_gossip(step)
        snapshots[step] = model.weight.detach().clone()
    assert sorted(hook.saved) == [1, 3]
    assert torch.equal(hook.saved[1][0], snapshots[1]) and torch.equal(
        hook.saved[3][0], snapshots[5]
    )
    path = tmp_path / "models.pt"
    torch.save({"epochs": {1: {0: hook.saved[1], 1: hook.saved[3]}}}, path)
    peer = problems.make_problem("models:epoch=1", 1, torch.float64, models_file=path)
    assert peer[0].dtype == torch.float64 and torch.equal(peer[0], snapshots[5].double())
    with pytest.raises(ValueError, match="saved at epochs"):
        problems.make_problem("models:epoch=3", 0, models_file=path)
    with pytest.raises(ValueError, match="no trained models"):
        problems.make_problem("models:epoch=1", 0, models_file=tmp_path / "missing.pt")


def _instance(tmp_path, problem, algorithms, reseed, seeds, budgets=(1e4, 3e4)):
    config = dict(
        topology="ring:4", problem=problem, algorithms=algorithms, reseed=reseed, seeds=list(seeds)
    )
    config.update(gammas=[0.1, 1.0], budgets=list(budgets), dtype="float64", stop_relative=1e-12)
    row = json.loads(
        json.dumps(instance.run_instance(**config, models_dir=str(tmp_path)))
    )  # as stored
    run = Run(f"ring:4/{problem}", config)
    record = Record(
        run.key, **run.identity(), quick=True, row=row, commit="c", finished="f", seconds=1.0
    )
    return row, page.load_instance(record, "cmd")


def test_seeds_rerun_the_chosen_algorithms_at_seed_zeros_best_gamma(tmp_path):
    specs = ["exact", "choco:compressor=sign", "choco:compressor=topk:0.2"]
    row, inst = _instance(
        tmp_path, "lowrank:r=2,sigma=0.1,n=12", specs, ["exact", "choco:compressor=sign"], (0, 1)
    )
    by_seed = {s: [r for r in inst["results"] if r["seed"] == s] for s in (0, 1)}
    assert len(by_seed[0]) == 5 and {r["label"] for r in by_seed[1]} == {
        "exact gossip",
        "Choco sign",
    }
    assert sorted(r["stage"] for r in by_seed[0] if r["swept"]) == [
        "full",
        "full",
        "screen",
        "screen",
    ]
    best = inst["summary"]["Choco sign"]["plot_spec"]
    assert [r["spec"] for r in by_seed[1] if r["label"] == "Choco sign"] == [best]
    from experiments.pages.consensus.page import page as draw

    text = draw([inst], "made by", {"seconds": 1.0, "cpu_count": 2, "machine": "x"})
    assert "## Winner map" in text and "| ring:4 | lowrank:r=2,sigma=0.1,n=12 | 2 |" in text
    assert files.heat_map([inst], inst["budgets"])[:4] == b"\x89PNG"


def test_packed_curves_read_back_bit_for_bit(tmp_path):
    row, inst = _instance(
        tmp_path, TINY, ["exact", "powergossip:rank=1,iters=1"], None, (0, 1), (1e4, 3e4)
    )
    assert [r["file"] for r in inst["results"]] == [
        "exact.jsonl",
        "powergossip_rank=1_iters=1.jsonl",
        "seed1/exact.jsonl",
        "seed1/powergossip_rank=1_iters=1.jsonl",
    ]
    packed = files.curves_bytes(inst)
    assert packed == files.curves_bytes(inst)  # no time stamp: the same runs, the same bytes
    lines = [json.loads(x) for x in gzip.decompress(packed).decode().splitlines()]
    # JSON writes a float's shortest repr, which parses back to the same double: equality.
    assert [{k: v for k, v in x.items() if k != "run"} for x in lines] == [
        r["curve"] for r in row["runs"]
    ]
    csv_rows = files.table_csv(inst).splitlines()
    assert len(csv_rows) == 1 + 4 * 2  # every run and seed at every budget


def test_page_lists_what_of_the_full_grid_did_not_run():
    from experiments.pages.consensus.page import not_run

    ran = [
        {"topology": "ring:8", "problem": p}
        for p in instance.FULL_GRID
        if p != "lowrank:r=16,sigma=0.3"
    ]
    ran.append({"topology": "torus:4x4", "problem": "matrix"})
    missing = not_run(ran)
    assert missing["ring:8"] == ["lowrank:r=16,sigma=0.3"]
    # the trained models exist for ring:8 only, so a torus page does not count them as missing
    assert "matrix" not in missing["torus:4x4"] and "cnn" in missing["torus:4x4"]
    assert not any(p.startswith("models:") for p in missing["torus:4x4"])
    assert len(missing["torus:4x4"]) == len(instance.FULL_GRID) - 1 - 3


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
