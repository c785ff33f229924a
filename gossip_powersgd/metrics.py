"""Monitoring quantities. Their all-reduces are metric traffic, never charged to an algorithm."""

from __future__ import annotations

import torch

from .algorithms.base import ParamsLike, named_tensors


def _flat64(params: ParamsLike) -> torch.Tensor:
    _, tensors = named_tensors(params)
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def consensus_distance(params: ParamsLike, comm) -> float:
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


def parameter_average(params: ParamsLike, comm) -> torch.Tensor:
    """The average over peers of the flattened parameters, in float64 (collective, metric traffic)."""
    return comm.allreduce_(_flat64(params), op="mean", metric=True)
