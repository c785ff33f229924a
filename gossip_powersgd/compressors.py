"""Compression operators C(x) with fixed-size wire formats, for Choco-SGD and DeepSqueeze.

The transport moves raw bytes into receive buffers that are allocated before any message arrives,
so every compressor states the exact payload size from the tensor's shape and dtype alone
(:meth:`Compressor.nbytes`) and never varies it with the data.

Conventions shared by every wire format below:

* Multi-byte fields are written in the machine's native byte order (little-endian on every platform
  torch supports), as the raw bytes of a contiguous tensor. Fields follow each other without
  padding; a field may therefore start at any byte offset, and readers copy rather than assume
  alignment. This also lets a caller pack several payloads back to back in one message buffer.
* Values, scales and norms are stored in the input tensor's dtype; indices as int32.
* Bit-packed fields are little-endian at the bit level: entry ``i`` of width ``b`` occupies the
  global bit positions ``i*b .. i*b+b-1`` (its least significant bit first), and global bit ``p``
  is bit ``p % 8`` of byte ``p // 8`` (numpy's ``packbits(bitorder="little")``). Unused bits of the
  last byte are zero.
* ``key`` is an integer both ends know (taken modulo 2**64). Anything random is drawn from
  ``torch.Generator(device="cpu").manual_seed(key)`` on the CPU, so CPU and GPU peers agree and the
  sender can compute exactly what its receivers decode. Same input and key give identical bytes.
* ``payload`` and ``out`` may live on a different device than the tensor (e.g. a CPU send buffer
  for a GPU parameter).

Public names: :class:`Compressor`, :class:`Identity`, :class:`TopK`, :class:`RandomK`,
:class:`SignNorm`, :class:`QSGD`, :class:`LowRank`, :func:`parse_compressor`,
:func:`encoded_size`.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Dict, Iterable, Optional, Tuple, Type

import torch
from torch import Tensor

from .specs import (
    check_seed,
    parse_spec,
    parse_typed,
    spec_error,
    unknown_name,
    unknown_option,
)

__all__ = [
    "Compressor",
    "Identity",
    "TopK",
    "RandomK",
    "SignNorm",
    "QSGD",
    "LowRank",
    "parse_compressor",
    "encoded_size",
]

_INDEX_DTYPE = torch.int32
_INDEX_BYTES = 4
_MASK64 = (1 << 64) - 1
# Beyond this a level no longer fits the int64 codes we pack, and float32 cannot resolve the
# stochastic rounding anyway.
_MAX_LEVELS = (1 << 31) - 1


# --------------------------------------------------------------------------------------------------
# small helpers


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _numel(shape) -> int:
    return math.prod(torch.Size(shape))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision tensors are processed in float32: CPU generators, QR and norms either do not
    # support them or lose too much precision; the stored fields stay in the tensor's dtype.
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _require_float(dtype: torch.dtype, who: str) -> None:
    if not dtype.is_floating_point:
        raise TypeError(f"{who} compresses floating-point tensors only, got {dtype}")


def _generator(seed: int) -> torch.Generator:
    """A CPU generator, so that peers on different devices draw the same numbers."""
    return torch.Generator(device="cpu").manual_seed(operator.index(seed) & _MASK64)


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _mix(*values: int) -> int:
    """Hash a sequence of integers into one 64-bit seed (order-sensitive, unlike string joining)."""
    h = 0
    for v in values:
        h = _splitmix64(h ^ (operator.index(v) & _MASK64))
    return h


def _put(out: Tensor, offset: int, field: Tensor) -> int:
    """Copy ``field``'s raw bytes into ``out[offset:]``; returns the offset after it."""
    raw = field.contiguous().reshape(-1).view(torch.uint8)
    end = offset + raw.numel()
    out[offset:end].copy_(raw)
    return end


def _get(payload: Tensor, offset: int, dtype: torch.dtype, count: int) -> Tuple[Tensor, int]:
    """Read ``count`` values of ``dtype`` from ``payload[offset:]``; returns (values, next offset).

    A byte slice can only be reinterpreted in place when its start is aligned to the item size,
    which is not the case for a payload packed after an odd-sized field or inside a larger message;
    then the bytes are copied to fresh (aligned) memory first.
    """
    size = _itemsize(dtype)
    end = offset + count * size
    raw = payload[offset:end]
    if raw.storage_offset() % size != 0:
        raw = raw.clone()
    return raw.view(dtype), end


def _pack_bits(codes: Tensor, width: int) -> Tensor:
    """Pack non-negative integer ``codes`` (each < 2**width) densely, ``width`` bits each."""
    if width <= 8:
        return _pack_narrow(codes, width)
    n = codes.numel()
    nbytes = (n * width + 7) // 8
    span = math.ceil((width + 7) / 8)  # bytes a code can touch, starting at any bit of its first
    offset = torch.arange(n, device=codes.device) * width
    shifted = codes << (offset % 8)  # the code placed within the bytes it overlaps
    first = offset // 8
    # Room for the last code's all-zero high bytes, so no index needs masking.
    acc = torch.zeros(nbytes + span, dtype=torch.int64, device=codes.device)
    # Codes own disjoint bits, so adding their byte contributions is the same as OR-ing them (and,
    # being integer, is order-independent on every device).
    for k in range(span):
        acc.scatter_add_(0, first + k, (shifted >> (8 * k)) & 0xFF)
    return acc[:nbytes].to(torch.uint8)


def _unpack_bits(packed: Tensor, n: int, width: int) -> Tensor:
    """Inverse of :func:`_pack_bits`: ``n`` int64 codes of ``width`` bits each."""
    if width <= 8:
        return _unpack_narrow(packed, n, width)
    offset = torch.arange(n, device=packed.device) * width
    first = offset // 8
    wide = torch.nn.functional.pad(packed, (0, 8)).to(torch.int64)  # reads past the end see zeros
    word = torch.zeros(n, dtype=torch.int64, device=packed.device)
    for k in range(math.ceil((width + 7) / 8)):
        word |= wide[first + k] << (8 * k)
    return (word >> (offset % 8)) & ((1 << width) - 1)


# Fast path for widths up to 8 bits: eight consecutive codes fill exactly ``width`` bytes, so each
# group of eight is assembled in one int64 word whose low ``width`` bytes (little-endian host) are
# the packed bytes. A handful of whole-vector operations instead of one per bit.


def _pack_narrow(codes: Tensor, width: int) -> Tensor:
    n = codes.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=codes.device)
    groups = (n + 7) // 8
    padded = torch.zeros(groups * 8, dtype=torch.int64, device=codes.device)
    padded[:n] = codes
    padded = padded.view(groups, 8)
    # A fresh tensor, not a clone of the column: the byte view below needs unit stride.
    word = torch.empty(groups, dtype=torch.int64, device=codes.device).copy_(padded[:, 0])
    for j in range(1, 8):
        word |= padded[:, j] << (j * width)
    packed = word.view(torch.uint8).view(groups, 8)[:, :width].reshape(-1)
    return packed[: (n * width + 7) // 8]


def _unpack_narrow(packed: Tensor, n: int, width: int) -> Tensor:
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=packed.device)
    groups = (n + 7) // 8
    flat = torch.zeros(groups * width, dtype=torch.uint8, device=packed.device)
    flat[: packed.numel()] = packed
    words = torch.zeros(groups, 8, dtype=torch.uint8, device=packed.device)
    words[:, :width] = flat.view(groups, width)
    word = words.view(torch.int64).view(groups, 1)
    # Arithmetic shifts of a negative word (width 8) bring in ones; the mask removes them.
    shifts = torch.arange(0, 8 * width, width, device=packed.device)
    codes = (word >> shifts) & ((1 << width) - 1)
    return codes.reshape(-1)[:n]


def _check_ratio(ratio) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real):
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
    ratio = float(ratio)
    if not 0.0 < ratio <= 1.0:  # also rejects NaN
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    return ratio


def _check_int(value, name: str, low: int, high: int | None = None) -> int:
    valid = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {valid}, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {valid}, got {value!r}")
    return value


def _selection_size(ratio: float, numel: int) -> int:
    # max(1, ·) so that small tensors still send something; min(numel, ·) only matters for empty ones.
    return min(numel, max(1, round(ratio * numel)))


# --------------------------------------------------------------------------------------------------
# the interface


class Compressor:
    """A compression operator C with a fixed-size byte payload.

    Subclasses implement :meth:`nbytes`, :meth:`_encode`, :meth:`_decode` and :meth:`__repr__`
    (which returns the spelling :func:`parse_compressor` accepts). The public :meth:`encode` and
    :meth:`decode` check the buffers, then delegate.

    A compressor is one of two kinds, which :meth:`variance_bound` tells apart:

    * *contractive* (biased): ``E‖C(x) − x‖² ≤ (1 − δ)‖x‖²`` for some δ > 0 — top-k, plain
      random-k, sign, low rank. ``variance_bound`` is None (the default for subclasses, which must
      then be contractive);
    * *unbiased*: ``E[C(x)] = x`` and ``E‖C(x)‖² ≤ (1 + ω)‖x‖²`` — identity (ω = 0), QSGD,
      rescaled random-k. ``variance_bound(numel)`` returns ω. Such a C need not be contractive
      (QSGD with few levels has ω ≫ 1), but ``C(x) / (1 + ω)`` is, with δ = 1 / (1 + ω)
      (Koloskova, Stich, Jaggi, ICML 2019, on unbiased quantizers): Choco-SGD and DeepSqueeze
      divide by :meth:`contraction_scale`.
    """

    name: str = ""

    def variance_bound(self, numel: int) -> Optional[float]:
        """ω of an unbiased compressor on a tensor of ``numel`` entries, None for a contractive one."""
        return None

    def contraction_scale(self, numel: int) -> float:
        """τ such that ``C(x) / τ`` is contractive: ``1 + ω`` if unbiased, 1 if already contractive."""
        omega = self.variance_bound(numel)
        return 1.0 if omega is None else 1.0 + float(omega)

    def nbytes(self, shape: torch.Size, dtype: torch.dtype) -> int:
        """Exact payload size in bytes for a tensor of ``shape`` and ``dtype``."""
        raise NotImplementedError

    def encode(self, x: Tensor, out: Tensor, key: int) -> None:
        """Write the payload of ``x`` into ``out`` (1-D uint8 of exactly ``nbytes`` bytes)."""
        self._check_buffer(out, x.shape, x.dtype, "out")
        self._encode(x, out, operator.index(key))

    def decode(self, payload: Tensor, out: Tensor, key: int) -> None:
        """Write C(x) into ``out`` (the original shape and dtype) from ``payload``."""
        self._check_buffer(payload, out.shape, out.dtype, "payload")
        key = operator.index(key)
        if out.is_contiguous():
            self._decode(payload, out, key)
        else:
            tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            self._decode(payload, tmp, key)
            out.copy_(tmp)

    def compress(self, x: Tensor, key: int = 0) -> Tensor:
        """C(x): what a receiver decodes from ``encode(x, key)``, same shape and dtype as ``x``."""
        payload = torch.empty(self.nbytes(x.shape, x.dtype), dtype=torch.uint8, device=x.device)
        self.encode(x, payload, key)
        result = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.decode(payload, result, key)
        return result

    # subclass hooks; ``out`` in _decode is contiguous
    def _encode(self, x: Tensor, out: Tensor, key: int) -> None:
        raise NotImplementedError

    def _decode(self, payload: Tensor, out: Tensor, key: int) -> None:
        raise NotImplementedError

    def _check_buffer(self, buf: Tensor, shape, dtype, what: str) -> None:
        expected = self.nbytes(shape, dtype)
        if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() != expected:
            raise ValueError(
                f"{self!r}: {what} must be a 1-D uint8 tensor of {expected} bytes for a "
                f"{tuple(shape)} {dtype} tensor, got {buf.dtype} of shape {tuple(buf.shape)}"
            )
        if not buf.is_contiguous():
            raise ValueError(f"{self!r}: {what} must be contiguous")

    def __repr__(self) -> str:
        return self.name

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash((type(self), repr(self)))


class Identity(Compressor):
    """No compression.

    Wire format: the tensor's raw bytes, ``numel * itemsize`` (row-major). Any dtype.
    """

    name = "identity"

    def variance_bound(self, numel: int) -> float:
        """Exact, hence unbiased with ω = 0."""
        return 0.0

    def nbytes(self, shape, dtype) -> int:
        return _numel(shape) * _itemsize(dtype)

    def _encode(self, x, out, key):
        _put(out, 0, x)

    def _decode(self, payload, out, key):
        values, _ = _get(payload, 0, out.dtype, out.numel())
        out.view(-1).copy_(values)


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
        self.ratio = _check_ratio(ratio)

    def k(self, numel: int) -> int:
        """Number of entries sent for a tensor of ``numel`` entries."""
        return _selection_size(self.ratio, numel)

    def nbytes(self, shape, dtype) -> int:
        _require_float(dtype, "TopK")
        numel = _numel(shape)
        if numel > torch.iinfo(_INDEX_DTYPE).max + 1:
            raise ValueError(f"TopK sends int32 indices; a tensor of {numel} entries is too large")
        return self.k(numel) * (_itemsize(dtype) + _INDEX_BYTES)

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        k = self.k(flat.numel())
        indices = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
        offset = _put(out, 0, flat[indices])
        _put(out, offset, indices.to(_INDEX_DTYPE))

    def _decode(self, payload, out, key):
        k = self.k(out.numel())
        values, offset = _get(payload, 0, out.dtype, k)
        indices, _ = _get(payload, offset, _INDEX_DTYPE, k)
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
        self.ratio = _check_ratio(ratio)
        self.seed = check_seed(seed)
        if not isinstance(scaled, bool):
            raise ValueError(f"scaled must be True or False, got {scaled!r}")
        self.scaled = scaled

    def k(self, numel: int) -> int:
        """Number of entries sent for a tensor of ``numel`` entries."""
        return _selection_size(self.ratio, numel)

    def variance_bound(self, numel: int) -> Optional[float]:
        """``numel / k − 1`` when scaled (unbiased), None for the plain (contractive) selection."""
        if not self.scaled:
            return None
        k = self.k(numel)
        return numel / k - 1.0 if k else 0.0

    def indices(self, numel: int, key: int) -> Tensor:
        """The flat indices (int64, CPU, ascending) selected for ``key``."""
        gen = _generator(_mix(self.seed, key))
        chosen = torch.randperm(numel, generator=gen)[: self.k(numel)]
        # Ascending order only makes the gather/scatter cache-friendly; the set is what matters.
        return chosen.sort().values

    def nbytes(self, shape, dtype) -> int:
        _require_float(dtype, "RandomK")
        return self.k(_numel(shape)) * _itemsize(dtype)

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        _put(out, 0, flat[self.indices(flat.numel(), key).to(flat.device)])

    def _decode(self, payload, out, key):
        numel = out.numel()
        values, _ = _get(payload, 0, out.dtype, self.k(numel))
        values = values.to(out.device)
        if self.scaled:
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


class SignNorm(Compressor):
    """Scaled sign: ``C(x) = (‖x‖₁ / d) · sign(x)``, so that ``‖C(x)‖₁ = ‖x‖₁``.

    ``sign(0) = +1`` (also for -0.0 and NaN): a zero entry decodes to ``+scale``. This keeps one
    bit per entry; a three-valued sign would need two.

    Wire format (``itemsize + ceil(d / 8)`` bytes, d = numel)::

        scale    itemsize       ‖x‖₁ / d in x's dtype (0 for an empty tensor)
        signs    ceil(d / 8)    bit i = 1 iff x_i < 0, bit-packed LSB first (see module docstring)
    """

    name = "sign"

    def nbytes(self, shape, dtype) -> int:
        _require_float(dtype, "SignNorm")
        return _itemsize(dtype) + (_numel(shape) + 7) // 8

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        d = flat.numel()
        cdt = _compute_dtype(flat.dtype)
        scale = (
            flat.to(cdt).abs().sum() / d if d else torch.zeros((), dtype=cdt, device=flat.device)
        )
        offset = _put(out, 0, scale.to(flat.dtype))
        _put(out, offset, _pack_bits((flat < 0).to(torch.int64), 1))

    def _decode(self, payload, out, key):
        d = out.numel()
        scale, offset = _get(payload, 0, out.dtype, 1)
        negative = _unpack_bits(payload[offset:].to(out.device), d, 1)
        signs = 1 - 2 * negative  # bit 1 -> -1, bit 0 -> +1
        out.view(-1).copy_(signs.to(out.dtype) * scale.to(out.device))


class QSGD(Compressor):
    """QSGD with ``s = levels`` levels: ``C(x)_i = ‖x‖₂ · sign(x_i) · ξ_i / s``.

    ``ξ_i`` is ``s·|x_i|/‖x‖₂`` rounded stochastically to one of its two neighbouring integers in
    ``[0, s]`` (up with probability equal to the fractional part), so ``E[C(x)] = x``. The uniform
    draws come from a CPU generator seeded by ``key``. Decoding needs no key.

    Each entry is one code of ``b = ceil(log2(s + 1)) + 1`` bits: the level ``ξ_i`` in the low
    ``b - 1`` bits and the sign (1 iff x_i < 0) in the top bit.

    Wire format (``itemsize + ceil(d * b / 8)`` bytes, d = numel)::

        norm     itemsize          ‖x‖₂ in x's dtype
        codes    ceil(d * b / 8)   d codes of b bits, densely bit-packed LSB first

    Unbiased with ``E‖C(x)‖² ≤ (1 + ω)‖x‖²``, ``ω = min(d / s², √d / s)`` (Alistarh et al.,
    "QSGD", NeurIPS 2017, Lemma 3.1): not contractive for coarse levels (ω ≫ 1), see
    :meth:`Compressor.contraction_scale`.
    """

    name = "qsgd"

    def __init__(self, levels: int):
        self.levels = _check_int(levels, "levels", 1, _MAX_LEVELS)
        self.level_bits = self.levels.bit_length()  # == ceil(log2(levels + 1))
        self.bits = self.level_bits + 1

    def variance_bound(self, numel: int) -> float:
        """``min(d / s², √d / s)`` for d = ``numel`` entries and s levels."""
        s = self.levels
        return min(numel / s**2, math.sqrt(numel) / s)

    def nbytes(self, shape, dtype) -> int:
        _require_float(dtype, "QSGD")
        return _itemsize(dtype) + (_numel(shape) * self.bits + 7) // 8

    def _encode(self, x, out, key):
        flat = x.reshape(-1)
        cdt = _compute_dtype(flat.dtype)
        norm = torch.linalg.vector_norm(flat.to(cdt)).to(flat.dtype)
        # Round with the norm exactly as stored, so that decoding the stored norm stays unbiased.
        stored_norm = norm.to(cdt)
        magnitude = flat.to(cdt).abs()
        if stored_norm > 0:
            scaled = (magnitude * (self.levels / stored_norm)).clamp_(max=self.levels)
        else:
            scaled = torch.zeros_like(magnitude)
        lower = scaled.floor()
        uniform = torch.rand(flat.numel(), generator=_generator(key), dtype=cdt).to(flat.device)
        level = (lower + (uniform < scaled - lower).to(cdt)).to(torch.int64)
        codes = level | ((flat < 0).to(torch.int64) << self.level_bits)
        offset = _put(out, 0, norm)
        _put(out, offset, _pack_bits(codes, self.bits))

    def _decode(self, payload, out, key):
        cdt = _compute_dtype(out.dtype)
        norm, offset = _get(payload, 0, out.dtype, 1)
        codes = _unpack_bits(payload[offset:].to(out.device), out.numel(), self.bits)
        level = codes & ((1 << self.level_bits) - 1)
        signs = 1 - 2 * (codes >> self.level_bits)
        step = norm.to(device=out.device, dtype=cdt) / self.levels
        out.view(-1).copy_(((signs * level).to(cdt) * step).to(out.dtype))

    def __repr__(self):
        return f"qsgd:{self.levels}"


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

    Otherwise — tensors of fewer than 2 dimensions, empty ones, and matrices too small to gain from
    factoring — the tensor is sent exactly as :class:`Identity` does (``numel * itemsize`` bytes),
    which is both smaller and lossless.
    """

    name = "lowrank"

    def __init__(self, rank: int, iterations: int = 1):
        self.rank = _check_int(rank, "rank", 1)
        self.iterations = _check_int(iterations, "iterations", 1)

    def factor_shapes(self, shape) -> Tuple[int, int, int] | None:
        """``(rows, cols, r)`` of the factorisation, or None when the tensor is sent exactly."""
        shape = torch.Size(shape)
        numel = _numel(shape)
        if len(shape) < 2 or numel == 0:
            return None
        rows = shape[0]
        cols = numel // rows
        r = min(self.rank, rows, cols)
        if r * (rows + cols) >= numel:
            return None
        return rows, cols, r

    def nbytes(self, shape, dtype) -> int:
        _require_float(dtype, "LowRank")
        factors = self.factor_shapes(shape)
        numel = _numel(shape) if factors is None else factors[2] * (factors[0] + factors[1])
        return numel * _itemsize(dtype)

    def _encode(self, x, out, key):
        factors = self.factor_shapes(x.shape)
        if factors is None:
            _put(out, 0, x)
            return
        rows, cols, r = factors
        cdt = _compute_dtype(x.dtype)
        # contiguous: BLAS rounds differently per memory layout, and equal inputs must give equal bits
        m = x.reshape(rows, cols).to(cdt).contiguous()
        q = torch.randn(cols, r, generator=_generator(key), dtype=cdt).to(x.device)
        for _ in range(self.iterations):
            # Householder QR: a zero or rank-deficient P still yields orthonormal columns (no
            # division by a vanishing norm), and P Pᵀ M then loses nothing of M's column space.
            p = torch.linalg.qr(m @ q, mode="reduced").Q
            q = m.T @ p
        offset = _put(out, 0, p.to(x.dtype))
        _put(out, offset, q.to(x.dtype))

    def _decode(self, payload, out, key):
        factors = self.factor_shapes(out.shape)
        if factors is None:
            values, _ = _get(payload, 0, out.dtype, out.numel())
            out.view(-1).copy_(values)
            return
        rows, cols, r = factors
        cdt = _compute_dtype(out.dtype)
        p, offset = _get(payload, 0, out.dtype, rows * r)
        q, _ = _get(payload, offset, out.dtype, cols * r)
        p = p.to(device=out.device, dtype=cdt).view(rows, r)
        q = q.to(device=out.device, dtype=cdt).view(cols, r)
        out.view(rows, cols).copy_(p @ q.T)

    def __repr__(self):
        spec = f"lowrank:{self.rank}"
        if self.iterations != 1:
            spec += f",iterations={self.iterations}"
        return spec


# --------------------------------------------------------------------------------------------------
# CLI spelling


# name -> (class, ordered (argument, kind) pairs; the first may be given positionally)
_SPECS: Dict[str, Tuple[Type[Compressor], Tuple[Tuple[str, type], ...]]] = {
    "identity": (Identity, ()),
    "topk": (TopK, (("ratio", float),)),
    "randomk": (RandomK, (("ratio", float), ("seed", int), ("scaled", bool))),
    "sign": (SignNorm, ()),
    "qsgd": (QSGD, (("levels", int),)),
    "lowrank": (LowRank, (("rank", int), ("iterations", int))),
}


def parse_compressor(spec) -> Compressor:
    """Build a compressor from its CLI spelling, e.g. ``"topk:0.01"`` or ``"lowrank:2,iterations=2"``.

    Grammar: ``name[:arg][,key=value...]`` (or ``name:key=value,...``), where the positional ``arg``
    is the first parameter: ``identity``, ``topk:RATIO``, ``randomk:RATIO[,seed=INT][,scaled=BOOL]``,
    ``sign``, ``qsgd:LEVELS``, ``lowrank:RANK[,iterations=INT]``. ``repr()`` of every compressor
    returns this spelling. A :class:`Compressor` instance is returned unchanged.
    """
    if isinstance(spec, Compressor):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"compressor spec must be a string, got {spec!r}")
    what = "compressor spec"
    parsed = parse_spec(spec, what)  # the one spec grammar (topologies.grammar, via specs.py)
    name = parsed.name
    if name not in _SPECS:
        raise unknown_name(what, spec, name, _SPECS)
    cls, params = _SPECS[name]
    kinds = dict(params)
    kwargs = {}
    if len(parsed.positional) > (1 if params else 0):
        item = parsed.positional[1 if params else 0]
        raise spec_error(what, spec, f"cannot parse {item!r}; expected key=value")
    items = [(params[0][0], value) for value in parsed.positional] + list(parsed.options.items())
    for key, value in items:
        if key not in kinds:
            raise unknown_option(what, spec, key, kinds)
        if key in kwargs:
            raise spec_error(what, spec, f"option {key!r} is given twice; give it once")
        try:
            kwargs[key] = parse_typed(value, kinds[key], key)
        except ValueError as exc:
            raise spec_error(what, spec, str(exc)) from None
    if params and params[0][0] not in kwargs:
        required = params[0][0]
        raise spec_error(what, spec, f"{name} needs {required}, e.g. {name}:<{required}>")
    return cls(**kwargs)


def encoded_size(compressor: Compressor, tensors: Iterable[Tensor]) -> int:
    """Total payload bytes to send ``tensors`` with ``compressor`` (the sum of their ``nbytes``)."""
    return sum(compressor.nbytes(t.shape, t.dtype) for t in tensors)
