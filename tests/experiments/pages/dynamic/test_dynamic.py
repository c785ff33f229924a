"""experiments/pages/dynamic: its plan, a consensus row on a one-peer schedule (exact averaging in
log2 n steps), a training row on a schedule, the accuracy-reach interpolation and the verdict on
hand-made rows."""

import math

import pytest

from experiments.pages import dynamic


def _runs(quick=True):
    return {run.key: run for run in dynamic.plan(quick, {})}


def test_plan_has_every_graph_and_algorithm_in_both_sections():
    runs = _runs()
    graphs = ["ring:4", "one_peer_exponential:4", "matchings:4"]
    expected = [f"{g}/{label}" for g in graphs for label in ("exact gossip", "PowerGossip r1")]
    expected.append("directed_exponential:4/push-sum")
    assert list(runs) == [f"{s}/{k}" for s in ("consensus", "training") for k in expected]
    assert len(_runs(False)) == 18


def test_exact_gossip_on_the_one_peer_schedule_averages_in_log2_n_steps():
    row = dynamic.row(_runs()["consensus/one_peer_exponential:4/exact gossip"])
    assert row["stop"] == "reached" and row["steps"] == 2  # log2(4) = 2 steps
    assert row["history"][-1]["error"] <= 1e-4 / 2 * row["error0"]


def test_a_training_row_on_a_schedule_names_its_gamma():
    row = dynamic.row(_runs()["training/matchings:4/PowerGossip r1"])
    assert "error" not in row and math.isfinite(row["acc_avg"]) and row["curve"]
    assert row["gamma_text"] == "1 (schedule)"  # an unset γ on a schedule is 1, not a topology's


def test_accuracy_reach_is_linear_between_evaluations():
    assert dynamic.reach([(1.0, 0.2), (3.0, 0.6)], 0.4) == pytest.approx(2.0)
    assert dynamic.reach([(1.0, 0.2), (3.0, 0.6)], 0.7) is None


def test_verdict_compares_each_schedule_with_each_static_graph():
    p = dynamic.setting(True)

    def consensus(topology, bits):
        return {
            "topology": topology,
            "label": "PowerGossip r1",
            "to_reach": {1e-2: bits, 1e-4: None},
        }

    rows = [
        consensus("ring:4", 4e5),
        consensus("one_peer_exponential:4", 1e5),
        consensus("matchings:4", None),
    ]
    (first, second) = dynamic.verdict(rows, [], p, None)
    assert "one_peer_exponential:4 vs ring:4: **yes**, 4.00× (fewer)" in first
    assert "matchings:4 vs ring:4: **no** (matchings:4 did not reach it)" in first
    assert "neither reached it" in second
