"""experiments/pages/bench_dp: every one-peer candidate, one private ring:8 run through the trainer,
the ratios (median of each repetition's own ratio) and the page drawn from a row made of them (its
full run is minutes)."""

import pytest

from experiments.engine import Record, Rows, Run
from experiments.pages import bench_dp

pytest.importorskip("opacus")

# Opacus' hooks engine (a candidate) warns about backward hooks on its first layer, as in training.


pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
    pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
]


def test_bench_dp_measures_every_candidate_and_renders_both_ratios():
    one_peer = {spec: bench_dp.measure_one_peer(spec, reps=1, steps=1) for spec in bench_dp.MODELS}
    for times in one_peer.values():
        assert all(len(t["cpu"]) == 1 and t["cpu"][0] > 0 for t in times.values())
    run = bench_dp._run("exact", "auto", 1, 8, bench_dp.QUICK_DATA)
    assert run["steps"] >= 1 and run["cpu"] > 0
    e2e = {
        f"{label} | DP {engine or 'off'}": {"cpu": [run["cpu"]], "wall": [run["wall"]]}
        for label, _ in bench_dp.ALGORITHMS
        for engine in (None, "auto", "hooks")
    }
    big = {
        spec: bench_dp.measure_one_peer(spec, reps=1, steps=1, batch=48) for spec in bench_dp.MODELS
    }
    assert all(len(times) == 1 + len(bench_dp.ENGINES) for times in big.values())
    parts = {spec: bench_dp.measure_parts(spec, reps=1, steps=1) for spec in bench_dp.MODELS}
    for part in parts.values():
        ops = part["operations"]
        # the clipped sum adds operations to the plain step, the noise more again
        assert 0 < ops["non-private"] < ops["clipped sum, ghost"] < ops["private step, ghost"]
    # a ratio is the median of each repetition's own ratio (2, 3, 4), not the ratio of medians (4)
    assert bench_dp._ratio([2.0, 9.0, 4.0], [1.0, 3.0, 1.0]) == 3.0
    # each repetition starts one candidate later: every candidate leads once in len(...) reps
    order = {"a": None, "b": None, "c": None}
    assert [[n for n, _ in bench_dp._rotated(order, rep)] for rep in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    config = dict(reps=1, steps=1, e2e_reps=1, e2e_epochs=1, dataset="mnist1d", big_batch=48)
    row = {
        "one_peer_ms": one_peer,
        "one_peer_big_batch_ms": big,
        "one_peer_parts_ms": {spec: part["times"] for spec, part in parts.items()},
        "one_peer_operations": {spec: part["operations"] for spec, part in parts.items()},
        "end_to_end_ms": e2e,
        "end_to_end_steps": run["steps"],
        "end_to_end_first": run["first"],
    }
    record = Record(
        "r",
        **Run("r", config).identity(),
        quick=True,
        row=row,
        commit="c",
        finished="d",
        seconds=1.0,
    )
    page = bench_dp.render(Rows("bench_dp", True, [record], 1))["bench_dp.md"]
    assert "## (c) Where the ghost engine's extra time goes" in page
    assert "Batch 48, the same way" in page and "| cnn1d | " in page.split("Batch 48")[1]
    assert "## (a) One peer, batch 32" in page and "## (b) ring:8, cnn1d, MNIST-1D" in page
    for row_start in (
        "| mlp:128,128 | **",
        "| cnn1d | **",
        "| exact gossip |",
        "| PowerGossip r1 |",
    ):
        assert row_start in page
    assert "clipped sum, ghost" in page and "DP, Opacus hooks" in page and "**1.00×**" in page
    assert (
        "**DP training at ≤ 2× the non-private time per step**, ring:8 cnn1d, exact gossip: "
        "MET (1.00×" in page
    )  # the same run in every column: ratio 1
    assert page.count("**The clipped sum at ≤ 1.5× a non-private step**") == 2
