"""Sparsifying compressors: :class:`TopK` (the largest entries, with their indices) and
:class:`RandomK` (coordinates both ends draw from the key, no indices sent)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..specs import check_seed
from . import wire
from .base import Compressor


class TopK(Compressor):
    """Keep the ``k = max(1, round(ratio * numel))`` entries of largest magnitude, zero the rest.

    Wire format (``k * (itemsize + 4)`` bytes)::

        values   k * itemsize   the kept entries, x's dtype, in ascending index order
        indices  k * 4          int32 flat (row-major) indices, ascending

    Ties in magnitude are broken by ``torch.topk``; the indices are sorted so that the same kept
    set always gives the same bytes. ``round`` is Python's (half to even).
    """

    name = "topk"

    def __init__(self, ratio: float):
        self.ratio = wire.check_ratio(ratio)

    def k(self, numel: int) -> int:
        """Number of entries sent for a tensor of ``numel`` entries."""
        return wire.selection_size(self.ratio, numel)

    def nbytes(self, shape, dtype) -> int:
        wire.require_float(dtype, "TopK")
        numel = wire.numel(shape)
        if numel > torch.iinfo(wire.INDEX_DTYPE).max + 1:
            raise ValueError(f"TopK sends int32 indices; a tensor of {numel} entries is too large")
        return self.k(numel) * (wire.itemsize(dtype) + wire.INDEX_BYTES)

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        k = self.k(flat.numel())
        indices = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
        offset = wire.put(out, 0, flat[indices])
        wire.put(out, offset, indices.to(wire.INDEX_DTYPE))

    def _decode(self, payload, out, key):
        k = self.k(out.numel())
        values, offset = wire.get(payload, 0, out.dtype, k)
        indices, _ = wire.get(payload, offset, wire.INDEX_DTYPE, k)
        flat = out.view(-1)
        flat.zero_()
        flat[indices.to(device=out.device, dtype=torch.int64)] = values.to(out.device)

    def __repr__(self):
        return f"topk:{self.ratio!r}"


class RandomK(Compressor):
    """Keep ``k = max(1, round(ratio * numel))`` coordinates chosen uniformly without replacement.

    The coordinates are the first ``k`` of a random permutation drawn from a CPU generator seeded
    by a hash of ``(seed, key)``; both ends draw them, so no indices are sent. With
    ``scaled=True`` the kept values are multiplied by ``numel / k`` on decode, which makes
    ``E[C(x)] = x``; otherwise C is the (biased, contractive) plain selection.

    Scaled, ``E‖C(x)‖² = (numel / k)‖x‖²``, so its variance bound is ``ω = numel / k − 1``; divided
    by ``1 + ω`` (see :meth:`Compressor.contraction_scale`) it is the plain selection again.

    Wire format (``k * itemsize`` bytes)::

        values   k * itemsize   the selected entries (unscaled), x's dtype, ascending index order
    """

    name = "randomk"

    def __init__(self, ratio: float, seed: int = 0, scaled: bool = False):
        self.ratio = wire.check_ratio(ratio)
        self.seed = check_seed(seed)
        if not isinstance(scaled, bool):
            raise ValueError(f"scaled must be True or False, got {scaled!r}")
        self.scaled = scaled

    def k(self, numel: int) -> int:
        """Number of entries sent for a tensor of ``numel`` entries."""
        return wire.selection_size(self.ratio, numel)

    def variance_bound(self, numel: int) -> Optional[float]:
        """``numel / k − 1`` when scaled (unbiased), None for the plain (contractive) selection."""
        if not self.scaled:
            return None
        k = self.k(numel)
        return numel / k - 1.0 if k else 0.0

    def indices(self, numel: int, key: int) -> Tensor:
        """The flat indices (int64, CPU, ascending) selected for ``key``."""
        gen = wire.generator(wire.mix(self.seed, key))
        chosen = torch.randperm(numel, generator=gen)[: self.k(numel)]
        # Ascending order only makes the gather/scatter cache-friendly; the set is what matters.
        return chosen.sort().values

    def nbytes(self, shape, dtype) -> int:
        wire.require_float(dtype, "RandomK")
        return self.k(wire.numel(shape)) * wire.itemsize(dtype)

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        wire.put(out, 0, flat[self.indices(flat.numel(), key).to(flat.device)])

    def _decode(self, payload, out, key):
        numel = out.numel()
        values, _ = wire.get(payload, 0, out.dtype, self.k(numel))
        values = values.to(out.device)
        if self.scaled and numel:  # an empty tensor sends nothing and has nothing to scale
            values = values * (numel / self.k(numel))
        flat = out.view(-1)
        flat.zero_()
        flat[self.indices(numel, key).to(out.device)] = values

    def __repr__(self):
        spec = f"randomk:{self.ratio!r}"
        if self.seed != 0:
            spec += f",seed={self.seed}"
        if self.scaled:
            spec += ",scaled=true"
        return spec
