"""Tests for gossip_powersgd.compressors.wire: dense bit packing round-trips, LSB first."""

import math

import pytest
import torch

from compressor_fixtures import as_bytes_int
from gossip_powersgd.compressors.wire import pack_bits, unpack_bits


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 9, 13, 32])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 29])
def test_bit_packing_round_trip(width, n):
    codes = torch.randint(0, 2**width, (n,), generator=torch.Generator().manual_seed(width + n))
    packed = pack_bits(codes, width)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n * width / 8)
    assert as_bytes_int(packed) == sum(int(v) << (i * width) for i, v in enumerate(codes))
    assert torch.equal(unpack_bits(packed, n, width), codes)
