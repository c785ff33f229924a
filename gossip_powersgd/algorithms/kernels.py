"""The tensor work of a gossip step, as functions that run without the GIL (TorchScript).

PyTorch lets the GIL go during each operation but takes it back between operations, so two peer
threads of the in-process cluster that compute at once (`LocalCluster(lanes=2)`) hand it back and
forth at every one of PowerGossip's few dozen small operations per half-step, and each hand-over
is a context switch. A function compiled by TorchScript runs all its operations in C++ and takes
the GIL only at its call, so two such peers do compute at once; issuing each operation also costs
less than from Python. The operations and their arguments are exactly those of the Python body,
so the bits are the same.

`utils.gil_free` compiles each on its first call; where TorchScript cannot, the Python body runs
(same bits, slower).
"""

from __future__ import annotations

import inspect
from typing import List, NamedTuple, Optional

import torch

from ..comm.base import Tensor
from ..utils import gil_free


@gil_free
def multiply_into_messages(
    factors: List[Tensor],
    norms: List[Tensor],
    norm_rows: List[Tensor],
    epsilon: Tensor,
    lefts: List[Tensor],
    rights: List[Tensor],
    products: List[Tensor],
    copy_to: List[Tensor],
    copy_from: List[Tensor],
    outgoing: Tensor,
) -> float:
    """A static half-step up to the exchange.

    First, rank-1 orthonormalisation of the `factors` stacks (none at other ranks): every vector
    (last dimension) divided by its norm plus `epsilon`, the norms written into `norms[i]`, views
    of the `norm_rows`, to which epsilon is added in one operation (the bits of
    `lowrank.orthonormalize_` at rank 1: each vector's own norm, plus epsilon, divides it).
    Then `products[i] = lefts[i] @ rights[i]` (bmm), and `copy_to[i] <- copy_from[i]` (the
    products and the exactly gossiped part into the messages). Returns the sum of `outgoing` (all
    the messages) for the finiteness check before they leave (`base.all_finite`)."""
    for i in range(len(factors)):
        torch.linalg.vector_norm(factors[i], 2.0, [-1], True, out=norms[i])
    for rows in norm_rows:
        rows.add_(epsilon)
    for i in range(len(factors)):
        factors[i].div_(norms[i])
    for i in range(len(lefts)):
        torch.bmm(lefts[i], rights[i], out=products[i])
    for i in range(len(copy_to)):
        copy_to[i].copy_(copy_from[i])
    # as base.all_finite sums: half-precision messages in float32
    if outgoing.element_size() < 4:
        return float(outgoing.sum(dtype=torch.float32).item())
    return float(outgoing.sum().item())


@gil_free
def form_factors_and_update(
    firsts: List[Tensor],
    seconds: List[Tensor],
    differences: List[Tensor],
    factors: List[Tensor],
    scales: List[Tensor],
    scaled: List[Tensor],
    matrices: List[Tensor],
    lefts: List[Tensor],
    rights: List[Tensor],
    exact: Optional[Tensor],
    received: List[Tensor],
    weights: List[float],
    gamma: float,
    scratch: Optional[Tensor],
) -> None:
    """A static half-step after the exchange: `differences[i] = firsts[i] - seconds[i]` (the new
    factors, from the two ends' products), `scaled[i] = factors[i] * scales[i]`, then
    `matrices[i] += lefts[i] @ rights[i]` (baddbmm_, the low-rank updates); and, given `exact`,
    `mix_exact(exact, received, weights, gamma, scratch)`."""
    for i in range(len(firsts)):
        torch.sub(firsts[i], seconds[i], out=differences[i])
    for i in range(len(factors)):
        torch.mul(factors[i], scales[i], out=scaled[i])
    for i in range(len(matrices)):
        matrices[i].baddbmm_(lefts[i], rights[i])
    if exact is not None and scratch is not None:
        _mix_exact(exact, received, weights, gamma, scratch)


def _mix_exact(
    x: Tensor, received: List[Tensor], weights: List[float], gamma: float, scratch: Tensor
) -> None:
    mix = scratch.zero_()
    total = 0.0
    for i in range(len(received)):
        mix.add_(received[i], alpha=weights[i])
        total += weights[i]
    mix.add_(x, alpha=-total)
    x.add_(mix, alpha=gamma)


@gil_free
def mix_exact(
    x: Tensor, received: List[Tensor], weights: List[float], gamma: float, scratch: Tensor
) -> None:
    """x += gamma * sum_j w_j (x_j - x), accumulated in neighbour order (deterministic bits)."""
    _mix_exact(x, received, weights, gamma, scratch)


class Normalization(NamedTuple):
    """The first arguments of `multiply_into_messages`: the rank-1 orthonormalisation (all empty
    lists at other ranks)."""

    factors: List[Tensor]
    norms: List[Tensor]
    norm_rows: List[Tensor]
    epsilon: Tensor


class Products(NamedTuple):
    """The rest of `multiply_into_messages`'s arguments: the products and the message copies."""

    lefts: List[Tensor]
    rights: List[Tensor]
    products: List[Tensor]
    copy_to: List[Tensor]
    copy_from: List[Tensor]
    outgoing: Tensor


class Update(NamedTuple):
    """The arguments of `form_factors_and_update`, by name (they are passed in this order)."""

    firsts: List[Tensor]
    seconds: List[Tensor]
    differences: List[Tensor]
    factors: List[Tensor]
    scales: List[Tensor]
    scaled: List[Tensor]
    matrices: List[Tensor]
    lefts: List[Tensor]
    rights: List[Tensor]
    exact: Optional[Tensor]
    received: List[Tensor]
    weights: List[float]
    gamma: float
    scratch: Optional[Tensor]


def _check_fields() -> None:
    """The named tuples list the compiled functions' parameters in order (they are splatted
    positionally, since a TorchScript call takes no keywords cheaply): refuse a drift at import."""
    multiply = list(inspect.signature(multiply_into_messages.python).parameters)
    update = list(inspect.signature(form_factors_and_update.python).parameters)
    if multiply != [*Normalization._fields, *Products._fields] or update != list(Update._fields):
        raise ImportError(
            "kernels: the named argument tuples no longer match the compiled "
            "functions' parameters; update them together"
        )


_check_fields()

__all__ = [
    "Normalization",
    "Products",
    "Update",
    "form_factors_and_update",
    "mix_exact",
    "multiply_into_messages",
]
