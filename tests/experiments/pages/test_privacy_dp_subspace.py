"""experiments/pages/privacy_dp_subspace.py: the subspace remedy judged against its plain rank by
twice the seed spread, one seed giving no verdict, the committed rows spending one ε per target, DP
on the sent messages costed by the same accountant."""

from __future__ import annotations

import pytest

from experiments.pages import _privacy as regime
from experiments.pages import privacy_dp_subspace as dp_subspace

from tests.experiments.pages._support import _committed

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
