"""The tensor work of a gossip step, as functions that run without the GIL (TorchScript).

PyTorch lets the GIL go during each operation but takes it back between operations, so two peer
threads of the in-process cluster that compute at once (`LocalCluster(lanes=2)`) hand it back and
forth at every one of PowerGossip's few dozen small operations per half-step, and each hand-over
is a context switch. A function compiled by TorchScript runs all its operations in C++ and takes
the GIL only at its call, so two such peers do compute at once; issuing each operation also costs
less than from Python. The operations and their arguments are exactly those of the Python body,
so the bits are the same.

`gil_free` compiles on the first call. Where TorchScript is not there or cannot compile a function
(a PyTorch without it; `PYTORCH_JIT=0`, under which `torch.jit.script` returns the function), the
Python body runs instead: same bits, slower. `torch.jit.script` is deprecated in recent PyTorch
releases; its deprecation warning is not passed on, since nothing here would change for it.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Callable, List

import torch

from ..comm.base import Tensor


def gil_free(fn: Callable) -> Callable:
    """`fn` compiled by TorchScript at its first call (`fn` itself where it cannot be). The
    Python body stays available as `.python`, and `.implementation()` says what runs (the tests
    compare the two)."""
    lock = threading.Lock()
    compiled: List[Callable] = []

    def implementation() -> Callable:
        if not compiled:
            with lock:  # peer threads may make the first call at once: compile once
                if not compiled:
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")  # torch.jit.script's deprecation
                            compiled.append(torch.jit.script(fn))
                    except Exception:  # noqa: BLE001 - whatever stops TorchScript: run the Python body
                        compiled.append(fn)
        return compiled[0]

    @functools.wraps(fn)
    def call(*args):
        return (compiled[0] if compiled else implementation())(*args)

    call.python = fn
    call.implementation = implementation
    return call


@gil_free
def normalize_rows(factors: List[Tensor], norms: List[Tensor], norm_rows: List[Tensor],
                   epsilon: Tensor) -> None:
    """Rank-1 orthonormalisation of several factor stacks: every vector (last dimension) of
    `factors[i]` divided by its norm plus `epsilon`. `norms[i]` receives the norms; the `norm_rows`
    are the tensors those are views of, so that epsilon is added to all in one operation (the
    bits of `lowrank.orthonormalize_` at rank 1: each vector's own norm, plus epsilon, divides it)."""
    for i in range(len(factors)):
        torch.linalg.vector_norm(factors[i], 2.0, [-1], True, out=norms[i])
    for rows in norm_rows:
        rows.add_(epsilon)
    for i in range(len(factors)):
        factors[i].div_(norms[i])


@gil_free
def multiply_into_messages(lefts: List[Tensor], rights: List[Tensor], products: List[Tensor],
                           copy_to: List[Tensor], copy_from: List[Tensor], outgoing: Tensor) -> float:
    """`products[i] = lefts[i] @ rights[i]` (bmm), then `copy_to[i] <- copy_from[i]` (the products
    and the exactly gossiped part into the messages), then the sum of `outgoing` (all the
    messages), for the finiteness check before they leave (`base.all_finite`)."""
    for i in range(len(lefts)):
        torch.bmm(lefts[i], rights[i], out=products[i])
    for i in range(len(copy_to)):
        copy_to[i].copy_(copy_from[i])
    # as base.all_finite sums: half-precision messages in float32
    if outgoing.element_size() < 4:
        return float(outgoing.sum(dtype=torch.float32).item())
    return float(outgoing.sum().item())


@gil_free
def form_factors_and_update(firsts: List[Tensor], seconds: List[Tensor], differences: List[Tensor],
                            factors: List[Tensor], scales: List[Tensor], scaled: List[Tensor],
                            matrices: List[Tensor], lefts: List[Tensor], rights: List[Tensor]) -> None:
    """After the exchange: `differences[i] = firsts[i] - seconds[i]` (the new factors, from the two
    ends' products), `scaled[i] = factors[i] * scales[i]`, then `matrices[i] += lefts[i] @ rights[i]`
    (baddbmm_, the low-rank updates)."""
    for i in range(len(firsts)):
        torch.sub(firsts[i], seconds[i], out=differences[i])
    for i in range(len(factors)):
        torch.mul(factors[i], scales[i], out=scaled[i])
    for i in range(len(matrices)):
        matrices[i].baddbmm_(lefts[i], rights[i])


@gil_free
def mix_exact(x: Tensor, received: List[Tensor], weights: List[float], gamma: float,
              scratch: Tensor) -> None:
    """x += gamma * sum_j w_j (x_j - x), accumulated in neighbour order (deterministic bits)."""
    mix = scratch.zero_()
    total = 0.0
    for i in range(len(received)):
        mix.add_(received[i], alpha=weights[i])
        total += weights[i]
    mix.add_(x, alpha=-total)
    x.add_(mix, alpha=gamma)


__all__ = ["form_factors_and_update", "gil_free", "mix_exact", "multiply_into_messages", "normalize_rows"]
