"""The churn page's measurements: one `gossip_powersgd.run` per row (every peer a thread of this
process).

`grid_row`: a random-churn run (accuracies, consensus distance, the members' average shift, and
the schedule's own figures: `membership.churn.schedule_figures`). `join_row`: one peer leaves and
comes back (`churn_join: average | copy`), measured by `training.churn_measure.rejoin_figures`."""

from __future__ import annotations

from typing import Any, Dict

#: Summary fields copied into a grid row (None where the run has none).
SUMMARY = {
    "acc_avg": "final_test_acc_avg_model",
    "acc_local_mean": "final_test_acc_local_mean",
    "acc_local_min": "final_test_acc_local_min",
    "consensus_distance": "final_consensus_distance",
    "average_shift_total": "average_shift_total",
    "membership_changes": "membership_changes",
    "live_peers_at_end": "live_peers_at_end",
    "mb_per_peer": "mb_sent_per_peer",
    "transfer_mb_sent": "transfer_mb_sent",
    "steps": "steps",
    "parameters": "parameters",
}


def grid_row(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """One (algorithm, topology, churn rate, seed) run's row."""
    from gossip_powersgd import run
    from gossip_powersgd.membership.churn import schedule_figures

    train = dict(config["train"], seed=seed)
    summary = run(train).summary
    row = {name: summary.get(key) for name, key in SUMMARY.items()}
    expected = train["epochs"] * config["steps_per_epoch"]
    if row["steps"] != expected:
        raise RuntimeError(
            f"the run made {row['steps']} steps, the page's per-step rate assumes {expected} "
            f"({config['steps_per_epoch']} per epoch): the recipe changed, fix STEPS_PER_EPOCH"
        )
    size = int(summary["peers"])
    row.update(schedule_figures(train["churn"], size, expected))
    return row


def join_row(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """One leave-and-rejoin run's row (`rejoin_figures`)."""
    from gossip_powersgd.training.churn_measure import rejoin_figures

    train = dict(config["train"], seed=seed)
    return rejoin_figures(train, config["joiner"], config["join_step"])
