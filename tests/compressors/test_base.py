"""Tests for gossip_powersgd.compressors.base: every compressor's sizes, buffers and determinism (the
interface's contract), the identity, the variance bounds and encoded_size."""

import pytest
import torch

from compressor_fixtures import ALL, DTYPES, IDS, SHAPES, decode, encode, expected_nbytes, randn
from gossip_powersgd.compressors import (
    QSGD,
    Identity,
    LowRank,
    RandomK,
    SignNorm,
    TopK,
    encoded_size,
)


@pytest.mark.parametrize("c", ALL, ids=IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nbytes_matches_formula_and_round_trip_shape(c, dtype):
    for i, shape in enumerate(SHAPES):
        x = randn(*shape, dtype=dtype, seed=i)
        n = c.nbytes(x.shape, dtype)
        assert n == expected_nbytes(c, shape, dtype), shape
        assert encoded_size(c, [x]) == n
        y = c.compress(x, key=3)
        assert y.shape == x.shape and y.dtype == dtype
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_encode_writes_exactly_nbytes_at_any_offset(c):
    x = randn(9, 11)
    n = c.nbytes(x.shape, x.dtype)
    reference = encode(c, x, key=5)
    # Whatever was in the buffer before (every byte written, padding bits zeroed) and wherever the
    # payload sits inside a larger message (odd offsets break naive dtype views), bytes are equal
    # and the guard bytes around it are untouched.
    for fill in (0x00, 0xFF):
        for offset in (0, 1, 3):
            message = torch.full((n + offset + 5,), 0xA5, dtype=torch.uint8)
            message[offset : offset + n] = fill
            c.encode(x, message[offset : offset + n], 5)
            assert torch.equal(message[offset : offset + n], reference)
            assert (message[:offset] == 0xA5).all() and (message[offset + n :] == 0xA5).all()
            assert torch.equal(decode(c, message[offset : offset + n], x, key=5), c.compress(x, 5))


@pytest.mark.parametrize("c", ALL, ids=IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_same_key_same_bits(c, dtype):
    x = randn(16, 3, 3, 3, dtype=dtype, seed=1)
    a, b = encode(c, x, key=11), encode(c, x.clone(), key=11)
    assert torch.equal(a, b)
    assert torch.equal(decode(c, a, x, key=11), decode(c, b, x, key=11))
    assert torch.equal(c.compress(x, 11), c.compress(x, 11))
    # What the sender computes for itself is exactly what a receiver decodes from the bytes.
    received = a.clone()
    assert torch.equal(decode(c, received, x, key=11), c.compress(x, 11))


@pytest.mark.parametrize("c", [RandomK(0.1), QSGD(4), LowRank(1)], ids=repr)
def test_randomized_compressors_depend_on_key(c):
    x = randn(20, 30)
    assert not torch.equal(encode(c, x, key=1), encode(c, x, key=2))


@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_non_contiguous_input_and_output(c):
    x = randn(11, 9).T  # a transposed view
    expected = c.compress(x.contiguous(), 4)
    assert torch.equal(c.compress(x, 4), expected)
    out = torch.empty(11, 9, dtype=x.dtype).T  # a non-contiguous (9, 11) destination
    c.decode(encode(c, x, key=4), out, 4)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_wrong_buffer_size_is_rejected(c):
    x = randn(9, 11)
    n = c.nbytes(x.shape, x.dtype)
    with pytest.raises(ValueError, match="bytes"):
        c.encode(x, torch.empty(n + 1, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match="bytes"):
        c.decode(torch.empty(n, dtype=torch.float32), torch.empty_like(x), 0)


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16, torch.int64])
def test_identity_round_trip_exact(dtype):
    c = Identity()
    x = (randn(7, 5, seed=2) * 100).to(dtype)
    payload = encode(c, x)
    assert torch.equal(payload, x.reshape(-1).view(torch.uint8))
    assert torch.equal(decode(c, payload, x), x)


def test_encoded_size_sums_tensors():
    tensors = [randn(10, 20), randn(20), randn(4, 3, 3, 3)]
    for c in ALL:
        assert encoded_size(c, tensors) == sum(c.nbytes(t.shape, t.dtype) for t in tensors)
    assert encoded_size(TopK(0.1), tensors) == (20 + 2 + 11) * 12


def test_lossy_compressors_reject_integer_tensors():
    for c in ALL[1:]:
        with pytest.raises(TypeError, match="floating"):
            c.nbytes(torch.Size([4]), torch.int64)


# ---- variance bounds and the contraction scale ------------------------------------------------------
def test_variance_bounds_say_which_compressors_are_unbiased():
    assert QSGD(2).variance_bound(10_000) == 50.0  # min(10000 / 4, 100 / 2)
    assert QSGD(2).variance_bound(100) == 5.0  # min(25, 5)
    assert QSGD(16).variance_bound(64) == 0.25  # min(64 / 256, 8 / 16)
    assert RandomK(0.25, scaled=True).variance_bound(100) == 3.0  # numel / k - 1
    assert Identity().variance_bound(7) == 0.0
    for contractive in (TopK(0.1), RandomK(0.25), SignNorm(), LowRank(2)):
        assert contractive.variance_bound(100) is None
        assert contractive.contraction_scale(100) == 1.0
    assert QSGD(2).contraction_scale(100) == 6.0
