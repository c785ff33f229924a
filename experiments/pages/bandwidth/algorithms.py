"""The rows of the bandwidth page: each algorithm's spec, what is tuned and over which grid, and
what its step-time measurement runs."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One row of the page. `spec`: the algorithm spec, "{gamma}" filled in per run; `tune`:
    "lr" (the learning rate over `grid`), "gamma" (γ over `grid`) or "gamma_x" (γ = value ×
    the topology's γ); `timing`: the spec the step-time measurements run (cost does not depend
    on γ; PowerSGD's exact all-reduce warm-up is measured as the all-reduce row, `warmup`)."""

    key: str
    label: str
    spec: str
    tune: str
    grid: Tuple[float, ...]
    timing: str
    local_steps: int = 1
    #: (steps, row key): the first `steps` steps cost what a step of that row costs
    warmup: Optional[Tuple[int, str]] = None
    #: its messages go round a ring of all hosts whatever the topology (an all-reduce): its step
    #: is measured on the tuning topology only and holds for every topology
    over_all_hosts: bool = False


def _powergossip(key: str, label: str, options: str) -> Algorithm:
    spec = f"powergossip:{options}"
    return Algorithm(key, label, spec + ",gamma={gamma}", "gamma_x", (0.5, 1.0), spec)


def _choco(key: str, label: str, compressor: str, grid: Tuple[float, ...]) -> Algorithm:
    """Choco at γ over `grid`, timed at its first γ."""
    spec = f"choco:compressor={compressor},gamma={{gamma}}"
    return Algorithm(key, label, spec, "gamma", grid, spec.format(gamma=grid[0]))


_REDUCE = dict(tune="lr", grid=(0.1, 0.2, 0.4), over_all_hosts=True)
#: start_iter 10 (its default): 10 exact all-reduces first, which cost an all-reduce step
_POWERSGD = dict(_REDUCE, timing="powersgd:rank=1,start_iter=0", warmup=(10, "allreduce"))
#: lr: the all-reduce grid's best, one point, to fit the plan in its time
_LOCAL = dict(tune="lr", grid=(0.4,), timing="exact", local_steps=4)
ALGORITHMS = (
    Algorithm("exact", "exact gossip", "exact:gamma={gamma}", "gamma_x", (0.5, 1.0), "exact"),
    _powergossip("pg-r1", "PowerGossip r1", "rank=1,iters=1"),
    _powergossip("pg-r2", "PowerGossip r2", "rank=2,iters=1"),
    _powergossip("pg-r1-2it", "PowerGossip r1, 2 iters", "rank=1,iters=2"),
    _choco("choco-sign", "Choco sign", "sign", (0.5, 1.0)),
    _choco("choco-topk", "Choco top-k 1%", "topk:0.01", (0.1, 0.2)),
    Algorithm("allreduce", "all-reduce", "allreduce", timing="allreduce", **_REDUCE),
    Algorithm("powersgd", "PowerSGD (centralized) r1", "powersgd:rank=1", **_POWERSGD),
    Algorithm("exact-h4", "exact gossip, H = 4 local steps", "exact:gamma={gamma}", **_LOCAL),
)
BY_KEY = {a.key: a for a in ALGORITHMS}
