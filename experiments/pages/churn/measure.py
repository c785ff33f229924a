"""The churn page's measurements: one `gossip_powersgd.run` per row (every peer a thread of this
process); a rejoin run with a watching hook on every peer for what its summary does not hold.

`grid_row`: a random-churn run (accuracies, consensus distance, the members' average shift, and
the schedule's own figures: departures and the share of peer-steps away). `join_row`: one peer
leaves and comes back (`churn_join: average | copy`); at every evaluation each member's
parameters are copied, so that the joiner's distance to the members' average and its accuracy
next to the others' spread are computed after the run."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import torch

from gossip_powersgd.training.hooks import TrainingHooks

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


class Watcher(TrainingHooks):
    """One peer's eval records and its parameters at each evaluation (float64, flattened): it
    changes no bit of the run."""

    name = "churn_page_watcher"
    optional = True

    def __init__(self):
        self.evals: List[Dict[str, Any]] = []
        self.params: Dict[int, torch.Tensor] = {}
        self.model = None

    def setup(self, context) -> None:
        self.model = context.model

    def on_record(self, record: Dict[str, Any]) -> None:
        if record.get("kind") == "eval":
            self.evals.append(dict(record))
            flat = [p.detach().reshape(-1).to(torch.float64) for p in self.model.parameters()]
            self.params[int(record["step"])] = torch.cat(flat)


def watched_run(train: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[int, Watcher]]:
    """Run `train` with a `Watcher` on every peer: (the run's summary, the lowest member's at the
    end; {rank: watcher})."""
    from gossip_powersgd import run

    watchers: Dict[int, Watcher] = {}

    def hooks(rank: int) -> List[TrainingHooks]:
        watchers[rank] = Watcher()
        return [watchers[rank]]

    return run(train, hooks=hooks).summary, watchers


def schedule_figures(spec: str, size: int, steps: int) -> Dict[str, Any]:
    """What the churn schedule itself does (the same changes the run applies): departures (peer
    leave events), returns, and the share of peer-steps spent away."""
    from gossip_powersgd.membership.churn import parse_churn

    changes = parse_churn(spec, size).changes(size, steps)
    live, departures, returns, away, last = set(range(size)), 0, 0, 0, 0
    for step, members in changes:
        away += (size - len(live)) * (step - last)
        departures += len(live - set(members))
        returns += len(set(members) - live)
        live, last = set(members), step
    away += (size - len(live)) * (steps - last)
    return {
        "departures": departures,
        "returns": returns,
        "scheduled_changes": len(changes),
        "away_share": away / (size * steps),
    }


def grid_row(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """One (algorithm, topology, churn rate, seed) run's row."""
    train = dict(config["train"], seed=seed)
    from gossip_powersgd import run

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


def _distance2(x: torch.Tensor, mean: torch.Tensor) -> float:
    return float(torch.sum((x - mean) ** 2))


def join_row(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """One leave-and-rejoin run: the shift of the members' average at the join (the library's
    own measure, from the evaluations around it) and, at each evaluation after the join, the
    joiner's test accuracy and squared distance to the members' average next to the others'."""
    train = dict(config["train"], seed=seed)
    joiner, join = config["joiner"], config["join_step"]
    summary, watchers = watched_run(train)
    leader = min(watchers)
    shifts = {int(e["step"]): e["average_shift_total"] for e in watchers[leader].evals}
    before = max(s for s in shifts if s <= join)
    after = min(s for s in shifts if s > join)
    probes = []
    for step in sorted(s for s in shifts if s > join):
        members = {r: w for r, w in watchers.items() if step in w.params}
        mean = torch.stack([w.params[step] for w in members.values()]).mean(0)
        acc = {
            r: next(e["test_acc_local"] for e in w.evals if e["step"] == step)
            for r, w in members.items()
        }
        others = [r for r in members if r != joiner]
        distances = {r: _distance2(w.params[step], mean) for r, w in members.items()}
        probes.append(
            {
                "steps_after_join": step - join,
                "members": len(members),
                "joiner_acc": acc[joiner],
                "others_acc_mean": math.fsum(acc[r] for r in others) / len(others),
                "others_acc_min": min(acc[r] for r in others),
                "others_acc_max": max(acc[r] for r in others),
                "joiner_distance2": distances[joiner],
                "others_distance2_mean": math.fsum(distances[r] for r in others) / len(others),
                "members_distance2_mean": math.fsum(distances.values()) / len(members),
                "consensus_distance": next(
                    e["consensus_distance"] for e in members[leader].evals if e["step"] == step
                ),
            }
        )
    return {
        "shift_at_join": shifts[after] - shifts[before],
        "shift_total": summary["average_shift_total"],
        "membership_changes": summary["membership_changes"],
        "transfer_mb_sent": summary["transfer_mb_sent"],
        "acc_avg": summary["final_test_acc_avg_model"],
        "probes": probes,
    }
