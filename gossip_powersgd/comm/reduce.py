"""The reduce ops of the all-reduce, the element steps they take, and which dtypes they reduce.

A dtype that travels (`comm.dtypes`) need not reduce: torch has no addition or maximum for the
unsigned kinds above uint8 or the float8 kinds, no mean (a division) of an integer, no maximum of a
complex number. `check_reducible` refuses those in one line before anything is sent, the same on
every transport (all of them go through `Communicator.allreduce_`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from .dtypes import dtype_code

Tensor = torch.Tensor

REDUCE_OPS = ("sum", "mean", "max", "min")


def reduce_in_rank_order(stacked: Sequence[Tensor], op: str) -> Tensor:
    """Reduce per-rank tensors in rank order (for small control data that is gathered anyway).

    Every peer reducing the same gathered list with this function gets the same bits. The
    communicators' `allreduce_` does not gather: it runs a ring (`comm.base`).
    """
    result = stacked[0].clone()
    for other in stacked[1:]:
        _combine_(result, other, op)
    if op == "mean":
        result.div_(len(stacked))
    return result


def _combine_(accumulator: Tensor, other: Tensor, op: str) -> None:
    if op in ("sum", "mean"):
        accumulator.add_(other)
    elif op == "max":
        torch.maximum(accumulator, other, out=accumulator)
    else:
        torch.minimum(accumulator, other, out=accumulator)


def check_reducible(tensor: Tensor, op: str, rank: int) -> None:
    """Refuse, in one line before anything is sent, an op or a dtype the ring cannot reduce: a
    dtype that travels (uint16/32/64, float8) may have no torch addition or maximum, an integer no
    mean; failing mid-ring left the peers out of step, with torch's own error."""
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; valid: {', '.join(REDUCE_OPS)}")
    dtype_code(tensor.dtype, rank, "the all-reduced tensor")
    reason = _unreducible(tensor.dtype, op, tensor.device.type)
    if reason is not None:
        raise ValueError(
            f"rank {rank}: an all-reduce with op {op!r} cannot reduce dtype {tensor.dtype} "
            f"(torch: {reason}): convert it, e.g. with .to(torch.float64), or use another op"
        )


@functools.lru_cache(maxsize=None)
def _unreducible(dtype: torch.dtype, op: str, device: str) -> str | None:
    """Why torch cannot apply `op`'s steps to `dtype` on `device` (None: it can), probed once on
    one element with the ring's own steps: `_combine_`, and the division of a mean."""
    try:
        one = torch.zeros(1, dtype=dtype, device=device)
        _combine_(one, one.clone(), op)
        if op == "mean":
            one.div_(2)
    except (RuntimeError, TypeError) as exc:  # NotImplementedError is a RuntimeError
        return str(exc).strip().splitlines()[0]
    return None
