"""`training.churn_measure`: a peer's return measured from outside the run. The watcher changes
no bit of the run; the members' mean squared distance to their average, computed from the
watchers' copies, is the run's own consensus distance; the joiner, handed its neighbours' mean,
starts next to the others."""

from __future__ import annotations

import pytest

from gossip_powersgd import run
from gossip_powersgd.training.churn_measure import rejoin_figures, watched_run

#: ring:4, 1600 training samples / (4 peers x batch 32): 13 steps an epoch; peer 1 leaves at step
#: 6 and comes back at step 25, its epoch's last step, so the first evaluation after it is 1 step
#: later.
CONFIG = dict(dataset="synthetic_logreg:d=20,classes=4,n=2000", model="logreg", epochs=3)
CONFIG.update(topology="ring:4", algorithm="exact", batch_size=32, lr=0.5, seed=0)
CONFIG.update(backend="local", quiet=True, log_every=0, eval_every=1, warmup_epochs=0.0)
CONFIG.update(on_peer_loss="continue", churn="leave:1@6,join:1@25", churn_join="average")


def test_the_watcher_changes_no_bit_of_the_run():
    summary, watchers = watched_run(CONFIG)
    plain = run(dict(CONFIG)).summary
    for key in ("final_test_acc_avg_model", "final_consensus_distance", "average_shift_total"):
        assert summary[key] == plain[key]
    assert sorted(watchers) == [0, 1, 2, 3]
    assert [e["step"] for e in watchers[0].evals] == sorted(watchers[0].params)


def test_rejoin_figures_match_the_runs_own_metrics():
    """Every probe after the join: 4 members again; their mean squared distance from the copied
    float64 parameters is the eval record's consensus distance (both float64 sums of the same
    squares in other orders: relative rounding ~ parameters x 2^-52, far below 1e-9); the shift
    at the join is part of the run's total."""
    out = rejoin_figures(CONFIG, joiner=1, join_step=25)
    assert out["membership_changes"] == 2 and out["transfer_mb_sent"] > 0
    assert 0.0 <= out["shift_at_join"] <= out["shift_total"]
    probes = out["probes"]
    assert [p["steps_after_join"] for p in probes] == [1, 14]
    for p in probes:
        assert p["members"] == 4
        assert p["members_distance2_mean"] == pytest.approx(p["consensus_distance"], rel=1e-9)
        assert p["others_acc_min"] <= p["others_acc_mean"] <= p["others_acc_max"]


@pytest.mark.parametrize(
    "churn, joiner, members_after",
    [("leave:0@6,join:0@25", 0, [4, 4]), ("leave:1@6,join:1@25,leave:0@30", 1, [4, 3])],
    ids=["peer-0-rejoins", "peer-0-leaves-after"],
)
def test_rejoin_figures_take_each_evaluation_from_its_lowest_member(churn, joiner, members_after):
    """Peer 0 need not be a member throughout: each evaluation's shift and consensus distance are
    its lowest member's. (Before, peer 0's records only: away at step 13, the run whose peer 0
    rejoins failed with a traceback; gone from step 30, the probe at step 39 was silently left
    out.) The consensus distance matches the copies' as above (rel 1e-9)."""
    out = rejoin_figures(dict(CONFIG, churn=churn), joiner=joiner, join_step=25)
    assert 0.0 <= out["shift_at_join"] <= out["shift_total"]
    probes = out["probes"]
    assert [p["steps_after_join"] for p in probes] == [1, 14]
    assert [p["members"] for p in probes] == members_after
    for p in probes:
        assert p["members_distance2_mean"] == pytest.approx(p["consensus_distance"], rel=1e-9)


def test_rejoin_figures_without_an_evaluation_on_each_side_of_the_join_are_refused():
    """A join before the first evaluation (step 13) has no shift to measure: one line, not a
    traceback from max() of nothing."""
    with pytest.raises(ValueError, match="no evaluation on each side of the join at step 8"):
        rejoin_figures(dict(CONFIG, churn="leave:1@2,join:1@8"), joiner=1, join_step=8)
