"""experiments/pages/privacy_dp_{sweep,budget,subspace}.py: the DP regime's pages. The budget after
which doubling the DP rows' epochs no longer pays, computed from the rows and held equal to the
privacy pages' DP_EPOCHS; the subspace remedy judged against its plain rank by twice the seed
spread; DP on the sent messages costed by the same accountant; the sweep's part 2 planned from
part 1's best row; and properties of the committed rows (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.engine import RowFile
from experiments.pages import _privacy as regime
from experiments.pages import privacy, privacy_dp_budget as dp_budget
from experiments.pages import privacy_dp_subspace as dp_subspace
from experiments.pages import privacy_dp_sweep as dp_sweep

RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"


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


def _committed(name):
    return [r.row for r in RowFile(RESULTS / f"{name}.jsonl").read().values()]


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


PLAIN, PROJECTED = dp_subspace.VARIANTS[1][0], dp_subspace.VARIANTS[2][0]


def _row(label, seed, acc, target=8.0, consensus=1.0):
    return dict(
        label=label,
        target=target,
        seed=seed,
        acc_avg=acc,
        consensus=consensus,
        consensus_history=[(15, 10 * consensus), (30, consensus)],
    )


@pytest.mark.parametrize(
    "variant, word",
    [
        ([0.60, 0.62, 0.61], "worse than it"),  # -20 pp, sd 1 pp
        ([0.805, 0.815, 0.81], "not distinguishable from it"),  # +0 pp
        ([0.90, 0.91, 0.92], "better than it"),  # +10 pp
    ],
)
def test_a_variant_is_judged_against_its_plain_rank_by_twice_the_seed_spread(variant, word):
    rows = [_row(PLAIN, s, a, consensus=5.0) for s, a in enumerate([0.80, 0.82, 0.81])]
    rows += [_row(PROJECTED, s, a, consensus=0.02) for s, a in enumerate(variant)]
    table = dp_subspace.cells(rows)
    assert table[(PROJECTED, 8.0)]["consensus_gm"] == pytest.approx(0.02)
    assert table[(PLAIN, 8.0)]["history_gm"] == pytest.approx({15: 50.0, 30: 5.0})
    text = dp_subspace.verdict_text(table, [8.0])
    assert f"{PROJECTED} reaches" in text and word in text
    assert "consensus distance at the end 0.02 against 5" in text
    # the paragraph's "does not rescue" only when the variant is worse by the rule
    rescued = dp_subspace.conclusion(table, [8.0])
    assert "5 → 0.02 at ε = 8" in rescued
    assert ("does not rescue" in rescued) == (word == "worse than it")


def test_one_seed_gives_no_verdict_and_a_failed_run_is_counted():
    rows = [_row(PLAIN, 0, 0.8), _row(PROJECTED, 0, 0.6), dict(_row(PROJECTED, 1, 0), error="x")]
    table = dp_subspace.cells(rows)
    assert table[(PROJECTED, 8.0)]["failed"] == 1
    assert "one seed: no spread to judge it by" in dp_subspace.verdict_text(table, [8.0])


def test_the_committed_subspace_rows_spend_one_epsilon_per_target():
    """The projection is post-processing of DP-SGD: at one target every variant runs with the
    same sigma and ends at the same epsilon (the runs solved sigma independently)."""
    rows = _committed("privacy_dp_subspace")
    assert len(rows) == len(dp_subspace.VARIANTS) * len(dp_subspace.TARGETS) * 3
    for target in dp_subspace.TARGETS:
        mine = [r for r in rows if r["target"] == target]
        assert len({(r["sigma"], r["eps_max"]) for r in mine}) == 1
        assert sum(1 for r in mine if r["extra"]) == 3 * 3  # 3 variants with keys, 3 seeds


def test_dp_on_the_messages_is_costed_by_the_same_accountant():
    """The page's reason not to run DP on what is sent: one Gaussian mechanism per message
    (q = 1, sensitivity 2B), composed over the run's steps; its noise is 2 z B with z from the
    same solver, and more messages need more noise."""
    from gossip_powersgd.privacy.accounting import noise_for_target

    rows = [dict(target=8.0, steps=960), dict(target=3.0, steps=480)]
    text = dp_subspace._message_dp(rows, [8.0, 3.0])
    z8 = noise_for_target(8.0, regime.DELTA, [1.0], 960)
    assert "ε = 8 over the 960 messages" in text and f"std {2 * z8:.3g} B" in text
    assert noise_for_target(8.0, regime.DELTA, [1.0], 1920) > z8 > 10  # noise far above the message
    assert "not computed" in dp_subspace._message_dp([], [8.0])


def test_the_sweep_plans_part_2_from_part_1s_best_row():
    part1 = dp_sweep.plan(False, {})
    assert [r.config["row"]["label"] for r in part1] == [s[0] for s in regime.SWEEP]
    rows = {r.key: dict(r.config["row"], acc_avg=0.5) for r in part1}
    best = part1[3]  # batch 256, lr 4, C 0.5
    rows[best.key]["acc_avg"] = 0.9
    runs = dp_sweep.plan(False, rows)
    clipped = runs[len(part1)].config
    assert clipped["row"]["label"] == dp_sweep.CLIPPED
    assert (clipped["row"]["lr"], clipped["row"]["clip"], clipped["row"]["target"]) == (
        4.0,
        0.5,
        None,
    )
    assert clipped["train"]["dp_noise_multiplier"] == 0.0  # clipped, no noise
    part2 = [r.config for r in runs[len(part1) + 1 :]]
    assert len(part2) == 2 * len(dp_sweep.ALGORITHMS)
    for dp, plain in zip(part2[::2], part2[1::2]):
        assert dp["train"]["dp_target_epsilon"] == regime.TARGET and dp["row"]["lr"] == 4.0
        assert "dp_max_grad_norm" not in plain["train"] and plain["row"]["batch"] == 128
    # part 2 waits for every part-1 row (the best one could still change)
    assert dp_sweep.plan(False, dict(list(rows.items())[:-1])) == part1
