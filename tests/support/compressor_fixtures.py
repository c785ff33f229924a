"""What the compressor tests share (tests/compressors/): one instance of every compressor, the
shapes and dtypes they run on, encode/decode with fresh buffers, and the wire formats' sizes restated
independently of the implementation."""

from __future__ import annotations

import math

import torch

from gossip_powersgd.compressors import QSGD, Compressor, Identity, LowRank, RandomK, SignNorm, TopK

DTYPES = [torch.float32, torch.float64]

# One instance of every compressor, lossy ones with parameters that actually compress.
ALL = [
    Identity(),
    TopK(0.1),
    RandomK(0.1),
    RandomK(0.25, seed=7, scaled=True),
    SignNorm(),
    QSGD(1),
    QSGD(16),
    QSGD(255),
    LowRank(1),
    LowRank(2, iterations=3),
]
IDS = [repr(c) for c in ALL]

# Shapes covering 1-D, sizes not divisible by 8, matrices, conv weights and a scalar.
SHAPES = [(1,), (13,), (64,), (9, 11), (16, 3, 3, 3), ()]


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=dtype)


def encode(c: Compressor, x, key=0, fill=0):
    out = torch.full((c.nbytes(x.shape, x.dtype),), fill, dtype=torch.uint8)
    c.encode(x, out, key)
    return out


def decode(c: Compressor, payload, like, key=0):
    out = torch.empty_like(like)
    c.decode(payload, out, key)
    return out


def as_bytes_int(payload: torch.Tensor) -> int:
    return int.from_bytes(bytes(payload.tolist()), "little")


def expected_nbytes(c: Compressor, shape, dtype) -> int:
    """The wire-format formulas, restated independently of the implementation."""
    d = math.prod(shape)
    item = torch.empty((), dtype=dtype).element_size()
    k = max(1, round(getattr(c, "ratio", 1) * d))
    if isinstance(c, Identity):
        return d * item
    if isinstance(c, TopK):
        return k * (item + 4)
    if isinstance(c, RandomK):
        return k * item
    if isinstance(c, SignNorm):
        return item + math.ceil(d / 8)
    if isinstance(c, QSGD):
        b = math.ceil(math.log2(c.levels + 1)) + 1
        return item + math.ceil(d * b / 8)
    if isinstance(c, LowRank):
        if len(shape) < 2:
            return d * item
        rows, cols = shape[0], d // shape[0]
        r = min(c.rank, rows, cols)
        return min(r * (rows + cols), d) * item
    raise AssertionError(c)
