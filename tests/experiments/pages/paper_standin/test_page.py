"""experiments/pages/paper_standin/page.py: accuracy at equal bytes on hand-made rows."""

from __future__ import annotations

from experiments.pages.paper_standin import page as text


def _row(label, curve):
    evals = [{"epoch": e, "mb": mb, "acc_avg": acc} for e, (mb, acc) in enumerate(curve, 1)]
    return {"label": label, "algorithm": label, "mb_per_peer": curve[-1][0], "evals": evals}


def test_accuracy_at_equal_bytes_takes_the_last_evaluation_within_the_budget():
    cheap = _row("cheap", [(1.0, 0.2), (2.0, 0.4)])
    dear = _row("dear", [(1.5, 0.3), (3.0, 0.5), (6.0, 0.7)])
    assert text.accuracy_at(dear, 2.0)["acc_avg"] == 0.3
    assert text.accuracy_at(dear, 6.0)["acc_avg"] == 0.7
    assert text.accuracy_at(dear, 1.0) is None  # first evaluation after the budget
    assert text._budgets([dear, cheap]) == [("cheap", 2.0), ("dear", 6.0)]
