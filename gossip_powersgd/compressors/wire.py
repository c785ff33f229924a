"""The fields every compressor's wire format is written with: raw byte fields at any offset, dense
bit packing, the CPU generator both ends draw from, and the checks of the constructors' arguments.

The conventions (native byte order, no padding, bit ``p`` is bit ``p % 8`` of byte ``p // 8``, the
key taken modulo 2**64) are the package's: see :mod:`gossip_powersgd.compressors`.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Tuple

import torch
from torch import Tensor

INDEX_DTYPE = torch.int32
INDEX_BYTES = 4
MASK64 = (1 << 64) - 1
# Beyond this a level no longer fits the int64 codes we pack, and float32 cannot resolve the
# stochastic rounding anyway.
MAX_LEVELS = (1 << 31) - 1


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def numel(shape) -> int:
    return math.prod(torch.Size(shape))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision tensors are processed in float32: CPU generators, QR and norms either do not
    # support them or lose too much precision; the stored fields stay in the tensor's dtype (but
    # QSGD's norm, stored in this dtype).
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def require_float(dtype: torch.dtype, who: str) -> None:
    if not dtype.is_floating_point:
        raise TypeError(f"{who} compresses floating-point tensors only, got {dtype}")


def generator(seed: int) -> torch.Generator:
    """A CPU generator, so that peers on different devices draw the same numbers."""
    return torch.Generator(device="cpu").manual_seed(operator.index(seed) & MASK64)


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix(*values: int) -> int:
    """Hash a sequence of integers into one 64-bit seed (order-sensitive, unlike string joining)."""
    h = 0
    for v in values:
        h = splitmix64(h ^ (operator.index(v) & MASK64))
    return h


def put(out: Tensor, offset: int, field: Tensor) -> int:
    """Copy ``field``'s raw bytes into ``out[offset:]``; returns the offset after it."""
    raw = field.contiguous().reshape(-1).view(torch.uint8)
    end = offset + raw.numel()
    out[offset:end].copy_(raw)
    return end


def get(payload: Tensor, offset: int, dtype: torch.dtype, count: int) -> Tuple[Tensor, int]:
    """Read ``count`` values of ``dtype`` from ``payload[offset:]``; returns (values, next offset).

    A byte slice can only be reinterpreted in place when its start is aligned to the item size,
    which is not the case for a payload packed after an odd-sized field or inside a larger message;
    then the bytes are copied to fresh (aligned) memory first.
    """
    size = itemsize(dtype)
    end = offset + count * size
    raw = payload[offset:end]
    if raw.storage_offset() % size != 0:
        raw = raw.clone()
    return raw.view(dtype), end


def pack_bits(codes: Tensor, width: int) -> Tensor:
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


def unpack_bits(packed: Tensor, n: int, width: int) -> Tensor:
    """Inverse of :func:`pack_bits`: ``n`` int64 codes of ``width`` bits each."""
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


def check_ratio(ratio) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real):
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
    ratio = float(ratio)
    if not 0.0 < ratio <= 1.0:  # also rejects NaN
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    return ratio


def check_int(value, name: str, low: int, high: int | None = None) -> int:
    valid = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {valid}, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {valid}, got {value!r}")
    return value


def selection_size(ratio: float, numel: int) -> int:
    # max(1, ·) so that small tensors still send something; min(numel, ·) only matters for empty ones.
    return min(numel, max(1, round(ratio * numel)))
