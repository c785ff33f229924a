"""experiments/pages/bandwidth/figures.py: steps to the target, the composition of times (warm-up steps,
evaluations), a step's three figures from measured parts, an all-reduce and the evaluation measured once
for every topology. The step timer, the recorded messages replayed and a peer alone are in
tests/training/test_timing.py; the page end to end (--quick, its committed rows) in
tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

import pytest

from experiments.pages.bandwidth import figures, recipe
from experiments.pages.bandwidth.figures import Schedule, _seeds


def test_first_reach_is_the_first_evaluation_at_or_above_the_target():
    evals = [[36, 0.50, 1.0], [72, 0.7499999, 2.0], [108, 0.75, 3.0], [144, 0.80, 4.0]]
    assert figures.first_reach(evals, 0.75) == (108, 3.0)
    assert figures.first_reach(evals, 0.50) == (36, 1.0)
    assert figures.first_reach(evals, 0.81) is None
    assert figures.evaluations_until(evals, 108) == 3
    assert figures.evaluations_until(evals, 107) == 2


def test_common_target_is_the_highest_whole_percent_every_run_reaches():
    assert figures.common_target([0.7349, 0.81, 0.79]) == 0.73
    assert figures.common_target([0.73]) == 0.73  # 100 * 0.73 is 72.999... in binary
    assert figures.common_target([0.7999999999, 0.9]) == 0.79


def test_a_schedule_charges_warm_up_steps_at_their_own_cost_and_every_evaluation():
    plan = Schedule(per_step=2.0, warm_steps=10, warm_per_step=5.0, per_eval=7.0)
    assert plan.training(4) == 20.0  # all inside the warm-up
    assert plan.training(25) == 10 * 5.0 + 15 * 2.0
    assert plan.until(25, 3) == 80.0 + 21.0
    assert Schedule(per_step=0.5).training(720) == 360.0


def test_seconds_to_target_per_seed_count_the_evaluations_up_to_the_one_that_reaches_it():
    seed0 = [[36, 0.6, 1], [72, 0.8, 2], [108, 0.85, 3]]
    seed1 = [[36, 0.6, 1], [72, 0.7, 2], [108, 0.79, 3]]
    plan = Schedule(per_step=0.1, per_eval=3.0)
    assert figures.per_seed_times([seed0, seed1], 0.8, plan) == pytest.approx([7.2 + 6.0, None])
    assert _seeds([13.2, None])["mean"] is None  # a seed that never reaches it: no mean
    curve = figures.mean_curve([seed0, seed1])
    assert [step for step, _ in curve] == [36, 72, 108]
    assert [acc for _, acc in curve] == pytest.approx([0.6, 0.75, 0.82], abs=1e-15)
    with pytest.raises(ValueError, match="different steps"):
        figures.mean_curve([seed0, [[35, 0.6, 1]]])


TIMING = {
    "wall": [1.0, 1.3, 1.1],
    "wall_mean": [1.1, 1.4, 1.2],
    "compute": [0.5, 0.6, 0.55],
    "arith": [0.1, 0.1, 0.1],
    "cpu": [0.2, 0.2, 0.2],
    "comm": [0.4, 0.6, 0.5],
    "replay": [0.9, 0.7, 2.0],
    "rounds": [2, 2, 2],
    "critical_bytes": [1_000_000, 1_250_000, 1_000_000],
    "bytes_sent": [2_000_000, 2_500_000, 2_000_000],
}


ALONE = {"cpu": 0.05, "arith": 0.01, "eval_cpu": 0.3}


def test_step_costs_compose_the_measured_parts_as_documented():
    c = figures.step_costs(TIMING, ALONE, "10mbit")
    assert (c["measured"], c["measured_median"]) == (1.4, 1.3)  # the slowest host's mean, median
    assert c["core_each"] == pytest.approx(0.05 + 0.9)  # CPU alone + the replays' median
    projected = 2 * figures.LATENCY_S + 1_250_000 * 8 / 1e7
    assert c["comm_projected"] == pytest.approx(projected)
    assert c["projected"] == pytest.approx(0.05 + projected)
    assert c["comm_egress"] == pytest.approx(2_500_000 * 8 / (1e7 * 1448 / 1514))
    # a ring host sends its two messages through one link: the egress model is twice the
    # projection, which charges an exchange its largest message only
    assert c["comm_egress"] / c["comm_projected"] == pytest.approx(2 * 1514 / 1448, rel=1e-3)
    e = figures.eval_costs(
        {"eval": {"seconds": [4.0, 5.0], "replay": [3.0], "metric_bytes": [8, 9]}}, ALONE
    )
    assert (e["measured"], e["core_each"], e["metric_bytes"]) == (5.0, pytest.approx(3.3), 9)


def test_an_all_reduce_and_the_evaluation_are_measured_once_for_every_topology():
    """Their rings go through all hosts whatever the gossip topology: torus:2x4 is not timed for
    them, and takes ring:8's measurements at the same rate."""
    from experiments.pages.bandwidth.figures import costs

    s = recipe.FULL
    runs = recipe.measurement_runs(s, {})
    torus = next(r for r in runs if r.key == "timing/torus:2x4/10mbit").config
    assert [a["key"] for a in torus["algorithms"]] == ["exact", "pg-r1"]
    assert torus["eval"] is False
    assert "alone/torus:2x4/allreduce" not in {r.key for r in runs}
    entry = dict(TIMING, periods=5, wall_min=[0.5], wall_max=[2.0])
    evaluation = {"seconds": [4.0], "cpu": [1.0], "replay": [3.0], "metric_bytes": [9]}
    common = {"load_before": [1, 1, 1], "load_after": [1, 1, 1]}
    data = {
        "timing/ring:8/10mbit": {
            "algorithms": {"exact": entry, "allreduce": dict(entry, wall_mean=[9.0])},
            "eval": evaluation,
            **common,
        },
        "timing/torus:2x4/10mbit": {"algorithms": {"exact": entry}, **common},
        "alone/ring:8/exact": ALONE,
        "alone/ring:8/allreduce": ALONE,
        "alone/torus:2x4/exact": dict(ALONE, cpu=0.5),
    }
    c = costs(s, data)
    ring, torus = c["ring:8"]["10mbit"], c["torus:2x4"]["10mbit"]
    assert torus["borrowed"] == {"allreduce": "ring:8"} and ring["borrowed"] == {}
    assert torus["steps"]["allreduce"] == ring["steps"]["allreduce"]
    assert torus["steps"]["allreduce"]["measured"] == 9.0
    assert torus["steps"]["exact"]["core_each"] == pytest.approx(0.5 + 0.9)  # its own alone
    assert torus["eval"] == ring["eval"] and ring["eval"]["core_each"] == pytest.approx(3.3)
