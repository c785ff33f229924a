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


ALGORITHMS = (
    Algorithm("exact", "exact gossip", "exact:gamma={gamma}", "gamma_x", (0.5, 1.0), "exact"),
    Algorithm(
        "pg-r1",
        "PowerGossip r1",
        "powergossip:rank=1,iters=1,gamma={gamma}",
        "gamma_x",
        (0.5, 1.0),
        "powergossip:rank=1,iters=1",
    ),
    Algorithm(
        "pg-r2",
        "PowerGossip r2",
        "powergossip:rank=2,iters=1,gamma={gamma}",
        "gamma_x",
        (0.5, 1.0),
        "powergossip:rank=2,iters=1",
    ),
    Algorithm(
        "pg-r1-2it",
        "PowerGossip r1, 2 iters",
        "powergossip:rank=1,iters=2,gamma={gamma}",
        "gamma_x",
        (0.5, 1.0),
        "powergossip:rank=1,iters=2",
    ),
    Algorithm(
        "choco-sign",
        "Choco sign",
        "choco:compressor=sign,gamma={gamma}",
        "gamma",
        (0.5, 1.0),
        "choco:compressor=sign,gamma=0.5",
    ),
    Algorithm(
        "choco-topk",
        "Choco top-k 1%",
        "choco:compressor=topk:0.01,gamma={gamma}",
        "gamma",
        (0.1, 0.2),
        "choco:compressor=topk:0.01,gamma=0.1",
    ),
    Algorithm(
        "allreduce",
        "all-reduce",
        "allreduce",
        "lr",
        (0.1, 0.2, 0.4),
        "allreduce",
        over_all_hosts=True,
    ),
    Algorithm(
        "powersgd",
        "PowerSGD (centralized) r1",
        "powersgd:rank=1",
        "lr",
        (0.1, 0.2, 0.4),
        "powersgd:rank=1,start_iter=0",
        warmup=(10, "allreduce"),  # start_iter 10 (its default): 10 exact all-reduces first
        over_all_hosts=True,
    ),
    Algorithm(
        "exact-h4",
        "exact gossip, H = 4 local steps",
        "exact:gamma={gamma}",
        "lr",
        (0.4,),  # the all-reduce grid's best: one point, to fit the plan in its time
        "exact",
        local_steps=4,
    ),
)
BY_KEY = {a.key: a for a in ALGORITHMS}
