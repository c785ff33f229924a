"""experiments/pages/training/convergence.py: the equal-bytes comparison (first reach of a target,
accuracy within a byte budget), the common target and budget, the non-IID gap table, a collapsed
row, all on synthetic rows with known answers (no training)."""

from __future__ import annotations

import pytest

from experiments.pages.training import convergence

from tests.experiments.pages.training._support import CHEAP, EXACT, _evals, _row


def test_first_reach_is_the_first_evaluation_at_or_above_the_target():
    assert convergence.first_reach(EXACT["evals"], 0.80)["epoch"] == 4
    assert convergence.first_reach(EXACT["evals"], 0.81)["mb"] == 30.0
    assert convergence.first_reach(EXACT["evals"], 0.95) is None
    # a peak then a dip: the first crossing counts
    dip = _evals([(1, 1.0, 0.7), (2, 2.0, 0.9), (3, 3.0, 0.85)])
    assert convergence.first_reach(dip, 0.88)["epoch"] == 2


def test_accuracy_at_mb_takes_the_last_evaluation_within_the_budget_without_interpolating():
    assert convergence.accuracy_at_mb(EXACT["evals"], 25.0) == 0.80
    assert convergence.accuracy_at_mb(EXACT["evals"], 20.0) == 0.80
    assert convergence.accuracy_at_mb(EXACT["evals"], 9.99) is None
    assert convergence.accuracy_at_mb(CHEAP["evals"], 1.5) == 0.88


def test_common_target_and_budget_are_the_worst_final_accuracy_and_the_cheapest_total():
    rows = [EXACT, CHEAP]
    assert convergence.common_target(rows) == pytest.approx(0.88)
    assert convergence.common_budget(rows) == 1.5
    # floored to 0.1 pp, so every row reaches it
    odd = _row("x", [(1, 1.0, 0.87654)])
    assert convergence.common_target([odd]) == pytest.approx(0.876)
    assert convergence.first_reach(odd["evals"], convergence.common_target([odd])) is not None
    failed = {"label": "y", "error": "diverged: nan"}
    assert convergence.common_target([EXACT, failed]) == pytest.approx(0.90)


def test_equal_bytes_table_reports_reach_and_accuracy_at_the_common_budget():
    table, target, budget = convergence.equal_bytes_table([EXACT, CHEAP])
    lines = table.strip().splitlines()
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "first reaches 88.00 % at" in lines[0] and "first reaches 85.00 % at" in lines[0]
    assert "acc after 1.5 MB / peer" in lines[0]
    exact_line, cheap_line = lines[2], lines[3]
    assert "30 MB (epoch 6)" in exact_line and "n/a" in exact_line  # nothing measured within 1.5 MB
    assert "1.5 MB (epoch 6)" in cheap_line and cheap_line.endswith("88.00 % |")
    best = convergence.cheapest_to_reach([EXACT, CHEAP], target)
    assert best["label"] == CHEAP["label"] and best["reach"]["mb"] == 1.5
    assert convergence.cheapest_to_reach([EXACT, CHEAP], 0.99) is None


def test_gap_table_and_the_setting_that_closes_the_gap():
    exact = _row("exact gossip", [(6, 30.0, 0.90)], spec="exact")
    r1 = _row("PowerGossip r1 (1 iter)", [(6, 1.0, 0.89)], acc_local_mean=0.85, acc_local_min=0.80)
    r2 = _row("PowerGossip r2 (1 iter)", [(6, 2.0, 0.895)], acc_local_mean=0.885)
    r4 = _row("PowerGossip r4 (1 iter)", [(6, 4.0, 0.90)], acc_local_mean=0.889)
    gaps = convergence.gaps(r1, exact)
    assert gaps["acc_local_mean"] == pytest.approx(100 * (0.89 - 0.85))
    assert gaps["acc_avg"] == pytest.approx(1.0)
    table = convergence.gap_table([r1, r2, r4], exact)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert (
        "| PowerGossip r1 (1 iter) | 85.00 % | 80.00 % | 89.00 % | 1.000 | +4.00 pp | +1.00 pp |"
        in table
    )
    # r2 is within 1 pp of exact's local mean (0.89 - 0.885 = 0.5 pp) and cheaper than r4
    assert convergence.closing_setting([r1, r2, r4], exact)["label"] == r2["label"]
    verdict = "\n".join(convergence.gap_verdict([r1, r2, r4], exact))
    assert (
        "**PowerGossip r2 (1 iter)**" in verdict
        and "2.0× PowerGossip r1 (1 iter)'s bytes" in verdict
    )
    assert "93.3 % fewer" in verdict  # 2 MB vs exact's 30 MB
    none = "\n".join(convergence.gap_verdict([r1], exact))
    assert "No setting of the grid" in none


def test_a_collapsed_row_neither_sets_the_target_nor_counts_as_cheapest():
    fell = _row("Choco top-k 1%", [(2, 0.2, 0.60), (4, 0.4, 0.76), (6, 0.6, 0.09)])
    assert convergence.collapsed(fell) and not convergence.collapsed(EXACT)
    assert convergence.common_target([EXACT, CHEAP, fell]) == pytest.approx(0.88)
    assert convergence.cheapest_to_reach([EXACT, CHEAP, fell], 0.70)["label"] == CHEAP["label"]
    table, _, budget = convergence.equal_bytes_table([EXACT, CHEAP, fell])
    assert budget == 0.6 and "9.00 % (collapsed: peak 76.00 % at epoch 4)" in table
    assert convergence.common_target([fell]) == pytest.approx(
        0.09
    )  # all collapsed: the worst of all
