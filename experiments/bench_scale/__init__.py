"""Scaling benchmark: cost vs number of peers and vs model size.

    python -m experiments.bench_scale                   # -> runs/bench_scale.md (+ .json)
    python -m experiments.bench_scale --out experiments/results/bench_scale.md   # the committed page
    python -m experiments.bench_scale --only mpi --out /tmp/mpi.md
    python -m experiments.bench_scale --plan tiny --out /tmp/tiny.md   # seconds: the code path only

For exact gossip, PowerGossip r1, all-reduce (`AllReduce`) and centralized PowerSGD r1
(`PowerSGDAllReduce`): time per step and bytes sent per rank against the number of peers
(in-process 8 ... 256, MPI and torch/gloo 2 ... 16 ranks, ResNet-20 shapes) and against model size
(1e4 ... 1e8 parameters, in-process); the library's ring all-reduce next to the all-gather
reduction it replaced (bytes received per rank and time); the in-process cluster's time and memory
at 256 peers; and the growth exponents fitted on log-log axes.

Modules: `measure` (what one peer times), `driver` (points, child processes, CLI), `report` (page).
"""

from .driver import Point, full_plan, main, run_point, tiny_plan
from .measure import KINDS, gather_reduce_, parameter_shapes, peer_point, square_shapes
from .report import render_markdown, slope, summarize

__all__ = [
    "KINDS",
    "Point",
    "full_plan",
    "gather_reduce_",
    "main",
    "parameter_shapes",
    "peer_point",
    "render_markdown",
    "run_point",
    "slope",
    "square_shapes",
    "summarize",
    "tiny_plan",
]
