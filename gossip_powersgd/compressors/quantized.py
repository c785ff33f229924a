"""Quantizing compressors: :class:`SignNorm` (one bit per entry and a scale) and :class:`QSGD`
(stochastic rounding to ``levels`` levels of the norm, unbiased)."""

from __future__ import annotations

import math

import torch

from . import wire
from .base import Compressor


class SignNorm(Compressor):
    """Scaled sign: ``C(x) = (‖x‖₁ / d) · sign(x)``, so that ``‖C(x)‖₁ = ‖x‖₁``.

    ``sign(0) = +1`` (also for -0.0 and NaN): a zero entry decodes to ``+scale``. This keeps one
    bit per entry; a three-valued sign would need two.

    Wire format (``itemsize + ceil(d / 8)`` bytes, d = numel)::

        scale    itemsize       ‖x‖₁ / d in x's dtype (0 for an empty tensor)
        signs    ceil(d / 8)    bit i = 1 iff x_i < 0, bit-packed LSB first (see the package docstring)
    """

    name = "sign"

    def nbytes(self, shape, dtype) -> int:
        wire.require_float(dtype, "SignNorm")
        return wire.itemsize(dtype) + (wire.numel(shape) + 7) // 8

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        d = flat.numel()
        cdt = wire.compute_dtype(flat.dtype)
        scale = (
            flat.to(cdt).abs().sum() / d if d else torch.zeros((), dtype=cdt, device=flat.device)
        )
        offset = wire.put(out, 0, scale.to(flat.dtype))
        wire.put(out, offset, wire.pack_bits((flat < 0).to(torch.int64), 1))

    def _decode(self, payload, out, key):
        d = out.numel()
        scale, offset = wire.get(payload, 0, out.dtype, 1)
        negative = wire.unpack_bits(payload[offset:].to(out.device), d, 1)
        signs = 1 - 2 * negative  # bit 1 -> -1, bit 0 -> +1
        out.view(-1).copy_(signs.to(out.dtype) * scale.to(out.device))


class QSGD(Compressor):
    """QSGD with ``s = levels`` levels: ``C(x)_i = ‖x‖₂ · sign(x_i) · ξ_i / s``.

    ``ξ_i`` is ``s·|x_i|/‖x‖₂`` rounded stochastically to one of its two neighbouring integers in
    ``[0, s]`` (up with probability equal to the fractional part), so ``E[C(x)] = x``. The uniform
    draws come from a CPU generator seeded by ``key``. Decoding needs no key.

    Each entry is one code of ``b = ceil(log2(s + 1)) + 1`` bits: the level ``ξ_i`` in the low
    ``b - 1`` bits and the sign (1 iff x_i < 0) in the top bit.

    Wire format (``normsize + ceil(d * b / 8)`` bytes, d = numel)::

        norm     normsize          ‖x‖₂ in x's dtype; in float32 (4 bytes) for a 16-bit x, whose
                                   finite entries can have a norm beyond the dtype's range
        codes    ceil(d * b / 8)   d codes of b bits, densely bit-packed LSB first

    A decoded entry is a multiple of ‖x‖₂ / s: in a 16-bit dtype it is ±inf where that multiple
    exceeds the dtype's largest value (float16: 65504), as C(x) itself cannot be represented.

    Unbiased with ``E‖C(x)‖² ≤ (1 + ω)‖x‖²``, ``ω = min(d / s², √d / s)`` (Alistarh et al.,
    "QSGD", NeurIPS 2017, Lemma 3.1): not contractive for coarse levels (ω ≫ 1), see
    :meth:`Compressor.contraction_scale`.
    """

    name = "qsgd"

    def __init__(self, levels: int):
        self.levels = wire.check_int(levels, "levels", 1, wire.MAX_LEVELS)
        self.level_bits = self.levels.bit_length()  # == ceil(log2(levels + 1))
        self.bits = self.level_bits + 1

    def variance_bound(self, numel: int) -> float:
        """``min(d / s², √d / s)`` for d = ``numel`` entries and s levels."""
        s = self.levels
        return min(numel / s**2, math.sqrt(numel) / s)

    def nbytes(self, shape, dtype) -> int:
        wire.require_float(dtype, "QSGD")
        norm_bytes = wire.itemsize(wire.compute_dtype(dtype))
        return norm_bytes + (wire.numel(shape) * self.bits + 7) // 8

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        cdt = wire.compute_dtype(flat.dtype)
        # Stored in the compute dtype (x's, float32 for 16-bit x): the norm of a float16 tensor
        # overflows float16 long before its entries do. Rounding uses it as stored: unbiased.
        norm = torch.linalg.vector_norm(flat.to(cdt))
        magnitude = flat.to(cdt).abs()
        if norm > 0:
            scaled = (magnitude * (self.levels / norm)).clamp_(max=self.levels)
        else:
            scaled = torch.zeros_like(magnitude)
        lower = scaled.floor()
        uniform = torch.rand(flat.numel(), generator=wire.generator(key), dtype=cdt).to(flat.device)
        level = (lower + (uniform < scaled - lower).to(cdt)).to(torch.int64)
        codes = level | ((flat < 0).to(torch.int64) << self.level_bits)
        offset = wire.put(out, 0, norm)
        wire.put(out, offset, wire.pack_bits(codes, self.bits))

    def _decode(self, payload, out, key):
        cdt = wire.compute_dtype(out.dtype)
        norm, offset = wire.get(payload, 0, cdt, 1)
        codes = wire.unpack_bits(payload[offset:].to(out.device), out.numel(), self.bits)
        level = codes & ((1 << self.level_bits) - 1)
        signs = 1 - 2 * (codes >> self.level_bits)
        step = norm.to(device=out.device, dtype=cdt) / self.levels
        out.view(-1).copy_(((signs * level).to(cdt) * step).to(out.dtype))

    def __repr__(self):
        return f"qsgd:{self.levels}"
