"""`python -m experiments.privacy_attacks.dp_budget` (experiments/privacy_attacks/dp_budget.py):
the budget after which doubling the DP rows' epochs no longer pays, computed from the rows, and
the privacy pages' DP_EPOCHS held equal to the committed page's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.privacy_attacks import dp_budget, dp_sweep

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"


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


def test_the_quick_page_is_computed_from_its_runs_and_renders_again(tmp_path):
    assert dp_budget.main(["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "privacy_dp_budget.json").read_text())
    page = (tmp_path / "privacy_dp_budget.md").read_text()
    rows = list(saved["rows"].values())
    assert len(rows) == len(dp_budget.QUICK_CELLS) * len(dp_budget.QUICK_BUDGETS)
    assert saved["verdicts"] == {
        f"{t:g}": e for t, e in dp_budget.verdicts(rows, dp_budget.QUICK_BUDGETS).items()
    }
    assert all(r["commit"] for r in rows)
    for r in rows:
        assert r["eps_max"] <= r["target"] * (1 + 1e-9)  # sigma solved for each budget's steps
        assert f"| {r['label']} | {r['target']:g} | {r['epochs']} | {r['steps']} |" in page
    for (label, target), values in dp_budget.gains(rows).items():
        assert f"| {label} | {target:g} | {values[0][2]:+.2f} pp |" in page
    assert not (tmp_path / "privacy_dp_budget.partial.json").exists()
    body = page[page.index("## Runs") :]
    assert dp_budget.main(["--quick", "--render-only", "--out", str(tmp_path)]) == 0
    again = (tmp_path / "privacy_dp_budget.md").read_text()
    assert again[again.index("## Runs") :] == body


def test_bad_jobs_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        dp_budget.main(["--quick", "--jobs", "0", "--out", str(tmp_path)])
    assert exc.value.code != 0
    assert "give 1 or more" in capsys.readouterr().err


def test_the_pages_dp_budgets_are_the_committed_pages_verdicts():
    saved = json.loads((RESULTS / "privacy_dp_budget.json").read_text())
    assert saved["budgets"] == list(dp_budget.BUDGETS)
    assert saved["threshold_pp"] == dp_budget.THRESHOLD_PP
    rows = list(saved["rows"].values())
    assert {(r["label"], r["target"]) for r in rows} == {(a, t) for a, _, t in dp_budget.CELLS}
    recomputed = dp_budget.verdicts(rows, dp_budget.BUDGETS)
    assert {float(t): e for t, e in saved["verdicts"].items()} == recomputed
    assert recomputed == dp_sweep.DP_EPOCHS


def test_every_epsilon_of_the_privacy_pages_has_a_budget_and_an_unknown_one_is_refused():
    from experiments.privacy_attacks import driver, measure
    from experiments.suite import privacy

    targets = {t for group in driver.PLAN_GROUPS for _, t in group if t is not None}
    assert targets | set(privacy.EPSILONS) - {None} <= set(dp_sweep.DP_EPOCHS)
    assert "epochs" not in measure.DP  # the budget comes with the row's epsilon
    with pytest.raises(ValueError, match="no DP budget for target epsilon 5"):
        dp_sweep.dp_epochs(5.0)


def test_the_budgets_in_words(monkeypatch):
    monkeypatch.setattr(dp_sweep, "DP_EPOCHS", {8.0: 30, 3.0: 15, 1.0: 15})
    assert dp_sweep.budget_text() == "30 epochs at ε = 8, 15 at ε = 3 and 1"
    monkeypatch.setattr(dp_sweep, "DP_EPOCHS", {8.0: 30})
    assert dp_sweep.budget_text() == "30 epochs at ε = 8"
