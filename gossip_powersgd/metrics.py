"""Monitoring quantities. Their all-reduces are metric traffic, never charged to an algorithm."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .algorithms.base import ParamsLike, named_tensors

if TYPE_CHECKING:
    from topologies import Topology
    from .comm.base import Comm


def _flat64(params: ParamsLike) -> torch.Tensor:
    _, tensors = named_tensors(params)
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def consensus_distance(params: ParamsLike, comm: Comm) -> float:
    """Mean over peers of ||x_i - x_bar||^2, summed over all tensors (computed in float64).

    Collective: every peer must call it, and every peer gets the same value. Traffic (metric
    counters): one ring all-reduce of the float64 parameters for x_bar, 2(n-1)/n x 8 bytes per
    parameter per peer, then one of the single scalar ||x_i - x_bar||^2. The centred form needs
    x_bar on every peer; the cheaper-looking mean ||x_i||^2 - ||x_bar||^2 (x_bar known chunk-wise
    after a reduce-scatter only) loses every digit once the peers are close, which is the regime
    this metric is for.
    """
    x = _flat64(params)
    mean = comm.allreduce_(x.clone(), op="mean", metric=True)
    local = torch.sum((x - mean) ** 2).reshape(1)
    comm.allreduce_(local, op="mean", metric=True)
    return float(local.item())


def parameter_average(params: ParamsLike, comm: Comm) -> torch.Tensor:
    """The average over peers of the flattened parameters, in float64 (collective, metric traffic)."""
    return comm.allreduce_(_flat64(params), op="mean", metric=True)


def _step_degrees(graph) -> int:
    """Sum over peers of the peers each sends to in one step's graph."""
    if graph.is_directed:
        return sum(graph.out_degrees)
    return sum(len(graph.neighbors(i)) for i in range(graph.size))


def mean_active_degree(topology: Topology, steps: int) -> float:
    """Mean over peers and over steps 0..steps-1 of the neighbours a peer sends to in that step.

    A static topology's mean degree (whatever `steps`); on a schedule the degree of each step's
    graph, not of the union (so per-step traffic formulas stay honest); on a directed graph the
    out-degree. A periodic schedule is summed over one period and its remainder.
    """
    if topology.period == 1 or steps <= 0:
        return _step_degrees(topology.at(0)) / topology.size
    period = topology.period
    counted = min(steps, period) if period else steps
    per_step = [_step_degrees(topology.at(t)) for t in range(counted)]
    if period and steps > period:
        full, rest = divmod(steps, period)
        total = full * sum(per_step) + sum(per_step[:rest])
    else:
        total = sum(per_step)
    return total / (topology.size * steps)
