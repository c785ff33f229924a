"""What a peer's return does to a run, measured from outside it (backend local: every peer a
thread of this process).

`ParameterWatcher` is a training hook that changes no bit of the run: it keeps its peer's eval
records and a float64 copy of its parameters at each evaluation. `watched_run(config)` runs with
one on every peer. `rejoin_figures(config, joiner, join_step)` measures a run whose ``churn``
schedule makes `joiner` leave and come back at `join_step` (handed its state by ``churn_join:
average | copy``): the jump of the members' average at the join (the library's own
``average_shift_total``, from the evaluations around it) and, at every evaluation after it, the
joiner's test accuracy and squared distance to the members' average next to the others'.

    row = rejoin_figures(dict(config, churn="leave:5@64,join:5@127", churn_join="average",
                              on_peer_loss="continue"), joiner=5, join_step=127)
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Tuple

import torch

from .hooks import TrainingHooks

__all__ = ["ParameterWatcher", "rejoin_figures", "watched_run"]


class ParameterWatcher(TrainingHooks):
    """One peer's eval records and its parameters at each evaluation (float64, flattened, by
    step): it changes no bit of the run."""

    name = "parameter_watcher"
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


def watched_run(config: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[int, ParameterWatcher]]:
    """Run `config` (a `gossip_powersgd.run` config) with a `ParameterWatcher` on every peer:
    (the run's summary, the lowest member's at the end; {rank: watcher})."""
    from gossip_powersgd.runner import run

    watchers: Dict[int, ParameterWatcher] = {}

    def hooks(rank: int) -> List[TrainingHooks]:
        watchers[rank] = ParameterWatcher()
        return [watchers[rank]]

    return run(dict(config), hooks=hooks).summary, watchers


def _distance2(x: torch.Tensor, mean: torch.Tensor) -> float:
    return float(torch.sum((x - mean) ** 2))


def _probe(watchers: Dict[int, ParameterWatcher], step: int, joiner: int, leader: ParameterWatcher):
    """The joiner against the other members at evaluation `step` (`leader`: the watcher of its
    lowest member, whose record has the consensus distance)."""
    members = {r: w for r, w in watchers.items() if step in w.params}
    mean = torch.stack([w.params[step] for w in members.values()]).mean(0)
    acc = {
        r: next(e["test_acc_local"] for e in w.evals if e["step"] == step)
        for r, w in members.items()
    }
    others = [r for r in members if r != joiner]
    distances = {r: _distance2(w.params[step], mean) for r, w in members.items()}
    return {
        "members": len(members),
        "joiner_acc": acc[joiner],
        "others_acc_mean": math.fsum(acc[r] for r in others) / len(others),
        "others_acc_min": min(acc[r] for r in others),
        "others_acc_max": max(acc[r] for r in others),
        "joiner_distance2": distances[joiner],
        "others_distance2_mean": math.fsum(distances[r] for r in others) / len(others),
        "members_distance2_mean": math.fsum(distances.values()) / len(members),
        "consensus_distance": next(
            e["consensus_distance"] for e in leader.evals if e["step"] == step
        ),
    }


def _leaders(watchers: Dict[int, ParameterWatcher]) -> Dict[int, ParameterWatcher]:
    """Each evaluation step -> the watcher of the lowest member that evaluated there (the one that
    logs then: peer 0 need not stay a member throughout)."""
    leaders: Dict[int, ParameterWatcher] = {}
    for rank in sorted(watchers, reverse=True):
        for record in watchers[rank].evals:
            leaders[int(record["step"])] = watchers[rank]
    return leaders


def rejoin_figures(config: Mapping[str, Any], joiner: int, join_step: int) -> Dict[str, Any]:
    """One leave-and-rejoin run (`config`'s churn schedule brings `joiner` back at `join_step`;
    each evaluation's figures are its lowest member's, whoever that is then): ``shift_at_join``
    (the members' average's jump between the evaluations around the join), the run's total shift,
    membership changes, state-transfer MB and final accuracy, and ``probes``: at each evaluation
    after the join that the joiner takes part in, its steps after it and `_probe`'s figures (the
    joiner's accuracy and squared distance to the members' average; the others' mean, min and max
    accuracy and mean distance; the members' mean distance, which is the eval record's consensus
    distance)."""
    summary, watchers = watched_run(config)
    leaders = _leaders(watchers)
    shifts = {
        step: next(e for e in w.evals if e["step"] == step)["average_shift_total"]
        for step, w in leaders.items()
    }
    if not any(s <= join_step for s in shifts) or not any(s > join_step for s in shifts):
        raise ValueError(
            f"no evaluation on each side of the join at step {join_step} (evaluations at steps "
            f"{sorted(shifts)}): lower eval_every or move the join between two evaluations"
        )
    before = max(s for s in shifts if s <= join_step)
    after = min(s for s in shifts if s > join_step)
    probes = [
        dict(steps_after_join=step - join_step, **_probe(watchers, step, joiner, leaders[step]))
        for step in sorted(s for s in shifts if s > join_step and s in watchers[joiner].params)
    ]
    return {
        "shift_at_join": shifts[after] - shifts[before],
        "shift_total": summary["average_shift_total"],
        "membership_changes": summary["membership_changes"],
        "transfer_mb_sent": summary["transfer_mb_sent"],
        "acc_avg": summary["final_test_acc_avg_model"],
        "probes": probes,
    }
