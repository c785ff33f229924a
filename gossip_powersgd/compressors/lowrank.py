"""The low-rank compressor: a rank-r approximation ``P Qᵀ`` by power iteration (:class:`LowRank`)."""

from __future__ import annotations

from typing import Tuple

import torch

from . import wire
from .base import Compressor


class LowRank(Compressor):
    """Rank-r approximation by subspace (power) iteration: ``C(x) = P Qᵀ``.

    The tensor is viewed as a matrix M of ``rows = shape[0]`` by ``cols = numel / rows`` (a conv
    weight (out, in, kh, kw) becomes out × in·kh·kw), and ``r = min(rank, rows, cols)``. Q starts
    as standard normal (cols × r) from a CPU generator seeded by ``key``; then ``iterations``
    rounds of ``P = M Q``, P orthonormalised (reduced QR), ``Q = Mᵀ P``. So ``C(x) = P Pᵀ M`` is
    the projection of M onto span(P), exact when rank(M) <= r (for a generic start) and zero for a
    zero matrix. Decoding needs no key.

    Wire format when the factors are smaller than the matrix, ``r * (rows + cols) < numel``
    (``r * (rows + cols) * itemsize`` bytes)::

        P        rows * r * itemsize   row-major, x's dtype
        Q        cols * r * itemsize   row-major, x's dtype

    For a 16-bit x, column k of P is multiplied and column k of Q divided by √‖Q[:, k]‖ (when
    not 0), so that neither overflows the dtype (Q's columns have norms up to ‖M‖₂).

    Otherwise — tensors of fewer than 2 dimensions, empty ones, and matrices too small to gain from
    factoring — the tensor is sent exactly as :class:`Identity` does (``numel * itemsize`` bytes),
    which is both smaller and lossless.
    """

    name = "lowrank"

    def __init__(self, rank: int, iterations: int = 1):
        self.rank = wire.check_int(rank, "rank", 1)
        self.iterations = wire.check_int(iterations, "iterations", 1)

    def factor_shapes(self, shape) -> Tuple[int, int, int] | None:
        """``(rows, cols, r)`` of the factorisation, or None when the tensor is sent exactly."""
        shape = torch.Size(shape)
        numel = wire.numel(shape)
        if len(shape) < 2 or numel == 0:
            return None
        rows = shape[0]
        cols = numel // rows
        r = min(self.rank, rows, cols)
        if r * (rows + cols) >= numel:
            return None
        return rows, cols, r

    def nbytes(self, shape, dtype) -> int:
        wire.require_float(dtype, "LowRank")
        factors = self.factor_shapes(shape)
        numel = wire.numel(shape) if factors is None else factors[2] * (factors[0] + factors[1])
        return numel * wire.itemsize(dtype)

    def _encode(self, x, out, key):
        factors = self.factor_shapes(x.shape)
        if factors is None:
            wire.put(out, 0, x)
            return
        rows, cols, r = factors
        cdt = wire.compute_dtype(x.dtype)
        # contiguous: BLAS rounds differently per memory layout, and equal inputs must give equal bits
        m = x.reshape(rows, cols).to(cdt).contiguous()
        q = torch.randn(cols, r, generator=wire.generator(key), dtype=cdt).to(x.device)
        for _ in range(self.iterations):
            # Householder QR: a zero or rank-deficient P still yields orthonormal columns (no
            # division by a vanishing norm), and P Pᵀ M then loses nothing of M's column space.
            p = torch.linalg.qr(m @ q, mode="reduced").Q
            q = m.T @ p
        if cdt != x.dtype:
            # A 16-bit x: Q's columns (norms up to ‖M‖₂, beyond float16's range for finite M) and
            # P's (unit norm) are scaled to equal norms, √‖q_k‖ each: the same P Qᵀ, and both fit.
            balance = torch.linalg.vector_norm(q, dim=0).sqrt()
            balance = torch.where(balance > 0, balance, torch.ones_like(balance))
            p, q = p * balance, q / balance
        offset = wire.put(out, 0, p.to(x.dtype))
        wire.put(out, offset, q.to(x.dtype))

    def _decode(self, payload, out, key):
        factors = self.factor_shapes(out.shape)
        if factors is None:
            values, _ = wire.get(payload, 0, out.dtype, out.numel())
            out.view(-1).copy_(values)
            return
        rows, cols, r = factors
        cdt = wire.compute_dtype(out.dtype)
        p, offset = wire.get(payload, 0, out.dtype, rows * r)
        q, _ = wire.get(payload, offset, out.dtype, cols * r)
        p = p.to(device=out.device, dtype=cdt).view(rows, r)
        q = q.to(device=out.device, dtype=cdt).view(cols, r)
        out.view(rows, cols).copy_(p @ q.T)

    def __repr__(self):
        spec = f"lowrank:{self.rank}"
        if self.iterations != 1:
            spec += f",iterations={self.iterations}"
        return spec
