"""The consensus experiment's added problems (closed forms), dtype and precision floor, matched-bit
cells, the winner map, and the one-line refusals of bad problem names and topologies."""

from __future__ import annotations

import math

import pytest
import torch

import topologies
from experiments import consensus
from experiments.consensus import compare
from gossip_powersgd import LocalCluster, consensus_distance

torch.set_num_threads(1)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_spectral_problem_has_the_stated_singular_values_and_norm(alpha):
    n = 30
    (x,) = consensus.make_problem(f"spectral:alpha={alpha},n={n}", 3, torch.float64, seed=1)
    values = torch.linalg.svdvals(x)
    expected = consensus.spectral_values(alpha, n)
    kappa = n / math.sqrt(sum(k ** (-2 * alpha) for k in range(1, n + 1)))
    assert torch.allclose(expected, kappa * torch.arange(1, n + 1, dtype=torch.float64) ** -alpha)
    assert torch.allclose(values, expected, rtol=1e-10, atol=1e-10)
    # ||X_i||^2 = n^2: the expected squared norm of the N(0,1) matrix problem of the same size.
    assert float(x.square().sum()) == pytest.approx(n * n, rel=1e-12)
    matrix = [consensus.make_problem(f"matrix:{n}", r, torch.float64)[0] for r in range(64)]
    assert sum(float(m.square().sum()) for m in matrix) / 64 == pytest.approx(n * n, rel=0.02)
    other = consensus.make_problem(f"spectral:alpha={alpha},n={n}", 4, torch.float64, seed=1)[0]
    assert not torch.equal(x, other)  # each peer its own U_i, V_i


@pytest.mark.parametrize("r", [1, 4])
def test_lowrank_differences_have_rank_at_most_r_without_noise(r):
    n = 24
    xs = [
        consensus.make_problem(f"lowrank:r={r},sigma=0,n={n}", i, torch.float64)[0]
        for i in range(5)
    ]
    for i in range(1, 5):
        assert int(torch.linalg.matrix_rank(xs[i] - xs[0])) <= r
    noisy = [
        consensus.make_problem(f"lowrank:r={r},sigma=0.1,n={n}", i, torch.float64)[0]
        for i in range(2)
    ]
    assert int(torch.linalg.matrix_rank(noisy[1] - noisy[0])) == n  # the noise is full rank


def _distance(comm, problem, seed):
    return consensus_distance(consensus.make_problem(problem, comm.rank, torch.float64, seed), comm)


def test_offset_problem_has_the_matrix_problems_consensus_distance():
    cluster = LocalCluster(topologies.parse("ring:4"))
    plain = cluster.run(_distance, "matrix", 2)[0]
    shifted = cluster.run(_distance, "offset:beta=10", 2)[0]
    assert shifted == pytest.approx(plain, rel=1e-12)
    a = consensus.make_problem("offset:beta=10", 0, torch.float64, seed=2)[0]
    b = consensus.make_problem("matrix", 0, torch.float64, seed=2)[0]
    assert float((a - b).square().mean()) == pytest.approx(100, rel=0.05)  # beta^2 x N(0,1)
    assert torch.equal(
        consensus.make_problem("offset:beta=0", 1, seed=2)[0],
        consensus.make_problem("matrix", 1, seed=2)[0],
    )


def test_seed_zero_is_the_original_problem_and_seeds_differ():
    generator = torch.Generator().manual_seed(42 + 3)
    original = torch.randn((100, 100), generator=generator, dtype=torch.float64).float()
    assert torch.equal(consensus.make_problem("matrix", 3)[0], original)
    assert not torch.equal(consensus.make_problem("matrix", 3, seed=1)[0], original)


@pytest.mark.parametrize(
    "name, message",
    [
        ("spectral", "give alpha="),
        ("spectral:alpha=x", "not a number"),
        ("lowrank:r=4", "give sigma="),
        ("lowrank:r=0,sigma=0", "integer >= 1"),
        ("offset:gamma=1", "bad option"),
        ("nope", "valid:"),
        ("models:epoch=2.5", "integer"),
        ("lowrank:r=200,sigma=0", "r must be <="),
    ],
)
def test_bad_problem_names_are_one_line_errors(name, message):
    with pytest.raises(ValueError, match=message) as info:
        consensus.parse_problem(name)
    assert "\n" not in str(info.value)


def test_schedules_are_refused_in_one_line_naming_the_fix():
    with pytest.raises(ValueError, match="static undirected graphs") as info:
        consensus.main(["--topology", "one_peer_exponential:16", "--steps", "1", "--no-plot"])
    assert "\n" not in str(info.value)
    assert consensus.parse_topology("ring:8", None).gamma == pytest.approx(
        topologies.parse("ring:8").gamma
    )


def _curve(comm, spec, dtype):
    return consensus.consensus_curve(
        comm,
        "matrix:12",
        spec,
        400,
        math.inf,
        (1e4,),
        stop_error=None,
        dtype=dtype,
        stop_at_floor=True,
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
    wide = cluster.run(_curve, spec, "float64")[0]
    narrow = cluster.run(_curve, spec, "float32")[0]
    first = {d: r["history"][1]["bits_per_peer"] for d, r in (("64", wide), ("32", narrow))}
    if spec.startswith(("exact", "powergossip")):
        assert first["64"] == 2 * first["32"]  # the same floats, 8 bytes each instead of 4
    assert wide["floor"] == pytest.approx(narrow["floor"] * (2.0**-52 / 2.0**-23) ** 2)
    for outcome in (wide, narrow):
        last = outcome["history"][-1]["error"]
        if outcome["stop"] == "floor":
            assert last <= consensus.FLOOR_MARGIN * outcome["floor"]
        else:
            assert all(
                r["error"] > consensus.FLOOR_MARGIN * outcome["floor"] for r in outcome["history"]
            )
    if spec == "exact":  # exact gossip contracts every step: float32 reaches its floor in 400 steps
        assert (
            narrow["stop"] == "floor"
            and wide["history"][-1]["error"] < narrow["history"][-1]["error"]
        )


def test_matched_cells_interpolate_at_the_budget_and_bound_early_stops():
    history = [
        {"step": 0, "bits_per_peer": 0.0, "error": 100.0},
        {"step": 1, "bits_per_peer": 10.0, "error": 10.0},
        {"step": 2, "bits_per_peer": 1000.0, "error": 0.1},
    ]
    cells = consensus.cells_for(history, (5, 100, 1000, 5000), "max_bits", "full", floor=1e-9)
    assert cells[5] == {"status": "—"}
    assert cells[100]["row"]["error"] == pytest.approx(
        1.0
    )  # log-log midpoint of (10, 10), (1000, 0.1)
    assert cells[100]["row"]["relative"] == pytest.approx(0.01) and not cells[100]["row"]["bound"]
    assert cells[5000] == {"status": "not reached"}
    stopped = consensus.cells_for(history, (5000,), "reached", "full", floor=0.02)[5000]["row"]
    assert stopped["bound"] and stopped["error"] == 0.1 and stopped["at_floor"]
    assert compare.reach_cells(history) == {1e-2: pytest.approx(100.0), 1e-4: None}


def _result(label, spec, seed, relative, reach=None, gamma=None, swept=False):
    cells = {
        1e5: {
            "status": "ok",
            "row": {
                "bits_per_peer": 1e5,
                "error": relative * 10,
                "relative": relative,
                "bound": False,
                "at_floor": False,
            },
        }
    }
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
    summary = consensus.summarize([r for r in results if r["seed"] == 0], (1e5,))
    record = {"summary": summary, "results": results, "budgets": [1e5]}
    cell = compare.winner_cell(record, "budget", 1e5)
    assert cell["winner"] == "Choco sign" and cell["runner_up"] == "PowerGossip r1"
    assert cell["margin"] == pytest.approx(
        1.0 / ((0.5 + 1.9 + 0.5) / 3)
    )  # Choco at gamma=1 on seed 0 too
    assert cell["spread"] == (pytest.approx(1 / 1.9), pytest.approx(2.0)) and cell["disagree"] == [
        1
    ]
    reach = compare.winner_cell(record, "reach", 1e-2)
    assert reach["winner"] == "Choco sign" and reach["margin"] == pytest.approx(20.0 / 5.0)
    assert "seed 1" in compare.winner_text(cell)
    assert compare.powergossip_ratio(record, "reach", 1e-2) == pytest.approx(4.0)


def test_models_problem_reads_the_saved_epochs(tmp_path):
    from experiments.consensus.models import SaveAtEpochs

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
    peer = consensus.make_problem("models:epoch=1", 1, torch.float64, models_file=path)
    assert peer[0].dtype == torch.float64 and torch.equal(peer[0], snapshots[5].double())
    with pytest.raises(ValueError, match="saved at epochs"):
        consensus.make_problem("models:epoch=3", 0, models_file=path)
    with pytest.raises(ValueError, match="no trained models"):
        consensus.make_problem("models:epoch=1", 0, models_file=tmp_path / "missing.pt")


def test_seeds_rerun_the_chosen_algorithms_at_seed_zeros_best_gamma(tmp_path):
    record = consensus.run_experiment(
        "ring:4",
        "lowrank:r=2,sigma=0.1,n=12",
        ["exact", "choco:compressor=sign", "choco:compressor=topk:0.2"],
        backend="local",
        out=tmp_path / "x",
        sweep=True,
        gammas=(0.1, 1.0),
        budgets=(1e4, 3e4),
        finalists=1,
        log=lambda *a, **k: None,
        plots=False,
        seeds=(0, 1),
        reseed=("exact", "choco:compressor=sign"),
    )
    by_seed = {s: [r for r in record["results"] if r["seed"] == s] for s in (0, 1)}
    assert len(by_seed[0]) == 5 and {r["label"] for r in by_seed[1]} == {
        "exact gossip",
        "Choco sign",
    }
    best = record["summary"]["Choco sign"]["plot_spec"]
    assert [r["spec"] for r in by_seed[1] if r["label"] == "Choco sign"] == [best]
    loaded = consensus.load_record(tmp_path / "x")
    for kind, key in compare.columns(record["budgets"]):
        assert compare.winner_cell(loaded, kind, key) == compare.winner_cell(record, kind, key)
    page = tmp_path / "page.md"
    (tmp_path / "consensus").mkdir()
    record["out"] = str(tmp_path / "x")
    consensus.write_report([record], "cmd", 1.0, path=page)
    text = page.read_text()
    assert "## Winner map" in text and "| ring:4 | lowrank:r=2,sigma=0.1,n=12 | 2 |" in text
    assert (tmp_path / "consensus" / "winner_map.png").exists()


def test_page_lists_what_of_the_full_grid_did_not_run():
    from experiments.consensus.driver import FULL_GRID
    from experiments.consensus.page_text import _not_run

    ran = [{"topology": "ring:8", "problem": p} for p in FULL_GRID if p != "lowrank:r=16,sigma=0.3"]
    ran.append({"topology": "torus:4x4", "problem": "matrix"})
    missing = _not_run(ran)
    assert missing["ring:8"] == ["lowrank:r=16,sigma=0.3"]
    # the trained models exist for ring:8 only, so a torus page does not count them as missing
    assert "matrix" not in missing["torus:4x4"] and "cnn" in missing["torus:4x4"]
    assert not any(p.startswith("models:") for p in missing["torus:4x4"])
    assert len(missing["torus:4x4"]) == len(FULL_GRID) - 1 - 3


def test_missing_needs_report():
    from experiments.consensus import main

    with pytest.raises(ValueError, match="--missing goes with --report"):
        main(["--missing"])
