"""The low-rank pieces PowerGossip and PowerSGD share: which tensors are compressed, how tensors of
one matrix shape are stacked, and how factors are orthonormalised.

A tensor of shape (d0, d1, ...) is treated as the d0 x (d1*d2*...) matrix of its row-major data.
Tensors of equal matrix shape are processed together as one (batch, rows, cols) stack, so a step
costs one batched multiplication per shape rather than one per tensor.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..comm.base import Tensor

#: Above this rank the factors are orthonormalised with a QR factorisation instead of Gram-Schmidt.
GRAM_SCHMIDT_MAX_RANK = 4
#: Added to column norms so that an all-zero column (identical models) stays zero, never NaN.
ORTHO_EPS = 1e-8


def ortho_eps(dtype: torch.dtype) -> float:
    """The epsilon added to a norm in `dtype`: ORTHO_EPS, or where that rounds to zero (float16,
    whose smallest positive value is 2^-24) that smallest value, so that a zero vector is still
    divided by a positive number and stays zero (0 / (0 + 0) would be NaN)."""
    info = torch.finfo(dtype)
    return max(ORTHO_EPS, info.tiny * info.eps)  # tiny * eps: the smallest subnormal


def orthonormalize_(factor: Tensor) -> Tensor:
    """Orthonormalise, in place, the r vectors of each (r, n) matrix of a (batch, r, n) tensor.

    Factors are stored vector-major (the transpose of the usual n x r), because the products with
    M are then the fast BLAS layouts. Gram-Schmidt dividing by (norm + `ortho_eps`) for small r (a
    zero vector stays zero, never NaN), QR above (in float32 for a 16-bit factor: torch has no
    16-bit QR).
    """
    r = factor.shape[-2]
    if r > GRAM_SCHMIDT_MAX_RANK:
        vectors = factor.transpose(-1, -2)
        wide = vectors.float() if factor.element_size() < 4 else vectors
        q, _ = torch.linalg.qr(wide, mode="reduced")
        return factor.copy_(q.transpose(-1, -2))
    eps = ortho_eps(factor.dtype)
    if r == 1:  # the same operations as the loop below, without slicing out the one vector
        return factor.div_(torch.linalg.vector_norm(factor, dim=-1, keepdim=True).add_(eps))
    for k in range(r):
        vector = factor[..., k : k + 1, :]
        for previous in range(k):
            basis = factor[..., previous : previous + 1, :]
            vector.sub_(basis * (basis * vector).sum(dim=-1, keepdim=True))
        vector.div_(torch.linalg.vector_norm(vector, dim=-1, keepdim=True).add_(eps))
    return factor


def check_compression_rate(min_compression_rate: float) -> None:
    """Refuse a `min_compression_rate` outside [0, inf): with nan or inf no matrix passes the rule
    of `compressible_matrices` (every comparison is False), so the run would gossip every tensor
    exactly while labelled as compressed (PowerGossip and PowerSGD share the check)."""
    if not 0 <= min_compression_rate < math.inf:
        raise ValueError(
            f"min_compression_rate must be >= 0 and finite, got {min_compression_rate} (0 "
            "compresses every matrix, 1 whatever gets smaller; nan and inf would compress none)"
        )


def compressible_matrices(
    tensors: Sequence[Tensor], rank: int, min_compression_rate: float
) -> Dict[Tuple[int, int], List[int]]:
    """Group the tensors worth sending in low-rank form by their matrix shape.

    A tensor of shape (d0, d1, ...) is viewed as a d0 x (d1*d2*...) matrix; it is compressed when
    (rows + cols) * r * min_compression_rate < rows * cols, r = min(rank, rows, cols) (PyTorch's
    PowerSGD rule). Returns {(rows, cols): [tensor indices]} in order of first appearance, which is
    the same on every peer.
    """
    shapes: Dict[Tuple[int, int], List[int]] = {}
    for k, tensor in enumerate(tensors):
        if tensor.dim() < 2 or tensor.numel() == 0:
            continue
        rows = tensor.shape[0]
        cols = tensor.numel() // rows
        r = min(rank, rows, cols)
        if (rows + cols) * r * min_compression_rate < rows * cols:
            shapes.setdefault((rows, cols), []).append(k)
    return shapes


def largest_compression_rate(tensors: Sequence[Tensor], rank: int) -> Optional[float]:
    """The largest rows * cols / ((rows + cols) * r) of `tensors`' matrices (None without one): a
    matrix is compressed when `min_compression_rate` is below its rate (`compressible_matrices`)."""
    rates = []
    for t in tensors:
        if t.dim() >= 2 and t.numel():
            rows, cols = t.shape[0], t.numel() // t.shape[0]
            rates.append(rows * cols / ((rows + cols) * min(rank, rows, cols)))
    return max(rates, default=None)


def refuse_rate_compressing_none(
    who: str,
    tensors: Sequence[Tensor],
    rank: int,
    min_compression_rate: float,
    default: float = 1.0,
    runs_as: str = "exact gossip",
    otherwise: str = "use the algorithm exact",
) -> None:
    """Refuse a finite `min_compression_rate` so high that no matrix is compressed although the
    algorithm's `default` rate compresses one: the run would be `runs_as` under a low-rank label,
    silently. A model that compresses nothing at the default either (vectors only, `rank` at full
    size, or for PowerSGD's default 2 only matrices less than twice smaller in low-rank form) is
    not refused: the algorithm keeps them exact by design at any rate."""
    largest = largest_compression_rate(tensors, rank)
    if (
        largest is None
        or largest <= max(1.0, default)
        or compressible_matrices(tensors, rank, min_compression_rate)
    ):
        return
    below = math.floor(largest * 1000) / 1000  # rounded down: every rate below it compresses
    compresses = "whatever gets smaller" if default <= 1 else f"what gets over {default:g}x smaller"
    raise ValueError(
        f"{who}: min_compression_rate {min_compression_rate:g} compresses no parameter (the largest "
        f"rate of this model's matrices at rank {rank} is {largest:.6g}), so the run would be "
        f"{runs_as}: set min_compression_rate below {below:g} ({default:g} compresses "
        f"{compresses}), or {otherwise}"
    )


def warn_if_rank_unreachable(who: str, tensors: Sequence[Tensor], rank: int) -> None:
    """One warning line when `rank` exceeds the smaller side of every matrix among `tensors`: each
    matrix then takes rank min(rank, rows, cols) (its full rank), and one that is no smaller in
    low-rank form is sent whole, so the run is what a smaller rank would give at best."""
    from ..utils import warn

    sides = [
        min(t.shape[0], t.numel() // t.shape[0]) for t in tensors if t.dim() >= 2 and t.numel()
    ]
    if sides and rank > max(sides):
        warn(
            f"{who}: rank {rank} exceeds the smaller side of every parameter matrix (at most "
            f"{max(sides)}): each matrix is approximated at rank min(rank, rows, cols), and one "
            "that is no smaller that way is sent whole"
        )


@dataclasses.dataclass
class MatrixStack:
    """The compressed tensors of one matrix shape, worked on as a (batch, rows, cols) stack.

    `rank` is the approximation's rank for this shape (the requested one, clipped to the smaller
    side). An algorithm subclasses this record to add the stacked buffers it keeps per shape.
    """

    indices: List[int]  # positions of the stacked tensors in the parameter list, in stack order
    rows: int
    cols: int
    rank: int

    @property
    def batch(self) -> int:
        return len(self.indices)

    def block(self, factors: Tensor, n: int) -> Tensor:
        """Part number n of factors kept side by side along dim 1, `rank` vectors per part."""
        return factors[:, n * self.rank : (n + 1) * self.rank, :]


def matrix_stacks(
    stack_type: type, tensors: Sequence[Tensor], rank: int, min_compression_rate: float
) -> List[MatrixStack]:
    """One `stack_type` (a `MatrixStack` subclass) per shape of `compressible_matrices`, in the
    order those shapes first appear (the same on every peer)."""
    shapes = compressible_matrices(tensors, rank, min_compression_rate)
    return [
        stack_type(indices, rows, cols, min(rank, rows, cols))
        for (rows, cols), indices in shapes.items()
    ]
