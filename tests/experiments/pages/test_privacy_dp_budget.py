"""experiments/pages/privacy_dp_budget.py: the budget after which doubling the DP rows' epochs no
longer pays, computed from the rows and held equal to the privacy pages' DP_EPOCHS (`_privacy`),
every ε of the privacy pages with its budget, the budgets in words."""

from __future__ import annotations

import pytest

from experiments.pages import _privacy as regime
from experiments.pages import privacy, privacy_dp_budget as dp_budget

from tests.experiments.pages._support import _committed


def _rows(accuracies):
    """Rows of two cells over the budgets 15, 30, 60 (accuracies in %, None = failed run)."""
    rows = []
    for (label, target), values in accuracies.items():
        for epochs, acc in zip((15, 30, 60), values):
            row = dict(label=label, target=target, epochs=epochs)
            if acc is None:
                row["error"] = "RuntimeError: diverged"
            else:
                row["acc_avg"] = acc / 100
            rows.append(row)
    return rows


@pytest.mark.parametrize(
    "a, b, expected",
    [
        # +3.4 then -0.7 (and +2.0 then +0.5): doubling 30 no longer pays on either cell
        ((89.7, 93.1, 92.4), (91.6, 93.6, 94.1), 30),
        # one cell still gains 1.2 pp from 30 to 60: no budget of the plan is shown a plateau
        ((89.7, 93.1, 92.4), (91.6, 93.6, 94.8), None),
        # nothing pays from 15 on: 15 (a later doubling must not pay either)
        ((93.0, 93.5, 93.2), (93.6, 93.1, 93.9), 15),
        # 15 -> 30 does not pay but 30 -> 60 does: 15 is not a plateau, and 30 is not either
        ((93.0, 93.5, 95.0), (93.6, 93.1, 93.9), None),
        # a failed run leaves its doubling unmeasured: not a plateau
        ((89.7, 93.1, None), (91.6, 93.6, 94.1), None),
    ],
)
def test_the_verdict_is_the_smallest_budget_after_which_no_doubling_pays(a, b, expected):
    rows = _rows({("exact gossip", 8.0): a, ("PowerGossip r4", 8.0): b})
    assert dp_budget.verdict(rows, (15, 30, 60), threshold=1.0) == expected


def test_each_epsilon_gets_its_own_verdict():
    # at epsilon 8 doubling 15 pays and 30 does not; at epsilon 3 doubling 15 already loses
    rows = _rows(
        {("exact gossip", 8.0): (91.2, 93.9, 92.0), ("exact gossip", 3.0): (89.6, 85.7, 75.3)}
    )
    assert dp_budget.verdicts(rows, (15, 30, 60), threshold=1.0) == {8.0: 30, 3.0: 15}
    # pooled, the epsilon-3 cell would not hold epsilon 8's rows back to 15: the pooled verdict is
    # the larger one
    assert dp_budget.verdict(rows, (15, 30, 60), threshold=1.0) == 30


def test_gains_are_the_accuracy_differences_in_points():
    rows = _rows({("exact gossip", 3.0): (80.0, 85.5, 85.0)})
    [(cell, gains)] = dp_budget.gains(rows).items()
    assert cell == ("exact gossip", 3.0)
    assert [(e, d) for e, d, _ in gains] == [(15, 30), (30, 60)]
    assert [g for _, _, g in gains] == pytest.approx([5.5, -0.5])


def test_the_pages_dp_budgets_are_the_committed_pages_verdicts():
    rows = _committed("privacy_dp_budget")
    assert {(r["label"], r["target"]) for r in rows} == {(a, t) for a, _, t in dp_budget.CELLS}
    assert {r["epochs"] for r in rows} == set(dp_budget.BUDGETS)
    assert dp_budget.verdicts(rows, dp_budget.BUDGETS) == regime.DP_EPOCHS
    for r in rows:  # sigma solved for each budget's steps: every peer at or below the target
        assert r["eps_max"] <= r["target"] * (1 + 1e-9)


def test_every_epsilon_of_the_privacy_pages_has_a_budget_and_an_unknown_one_is_refused():
    from experiments.pages.privacy_attacks.regimes import DP, REGIMES

    groups = REGIMES["privacy_attacks"]["groups"]
    targets = {t for group in groups for _, t in group if t is not None}
    assert targets | set(privacy.EPSILONS) - {None} <= set(regime.DP_EPOCHS)
    assert "epochs" not in DP  # the budget comes with the row's epsilon
    with pytest.raises(ValueError, match="no DP budget for target epsilon 5"):
        regime.dp_epochs(5.0)


def test_the_budgets_in_words(monkeypatch):
    monkeypatch.setattr(regime, "DP_EPOCHS", {8.0: 30, 3.0: 15, 1.0: 15})
    assert regime.budget_text() == "30 epochs at ε = 8, 15 at ε = 3 and 1"
    monkeypatch.setattr(regime, "DP_EPOCHS", {8.0: 30})
    assert regime.budget_text() == "30 epochs at ε = 8"
