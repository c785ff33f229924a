"""Tests for gossip_powersgd.compressors.sparse: top-k keeps the k largest, random-k draws its
coordinates from the key and, scaled, is unbiased."""

import math

import pytest
import torch

from compressor_fixtures import DTYPES, decode, encode, randn
from gossip_powersgd.compressors import RandomK, TopK


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5, 1.0])
def test_topk_keeps_exactly_the_k_largest(dtype, ratio):
    x = randn(10, 17, dtype=dtype, seed=3)
    c = TopK(ratio)
    k = max(1, round(ratio * x.numel()))
    y = c.compress(x)
    kept = y != 0
    assert kept.sum() == k
    assert torch.equal(y[kept], x[kept])
    # Every kept magnitude is at least every dropped one.
    if k < x.numel():
        assert x.abs()[kept].min() >= x.abs()[~kept].max()
    # Payload: values then int32 indices, ascending.
    payload = encode(c, x)
    item = x.element_size()
    indices = payload[k * item :].clone().view(torch.int32).long()
    assert torch.equal(indices, kept.reshape(-1).nonzero().reshape(-1))
    assert torch.equal(payload[: k * item].clone().view(dtype), x.reshape(-1)[indices])


def test_randomk_same_key_same_indices_other_key_other_indices():
    x = torch.arange(1, 201, dtype=torch.float64)  # distinct values reveal where each one lands
    c = RandomK(0.05)
    payload = encode(c, x, key=42)
    same = decode(c, payload, x, key=42)
    support = same != 0
    assert support.sum() == 10
    assert torch.equal(same[support], x[support])  # decoded at the very indices it was encoded from
    other = decode(c, payload, x, key=43)
    assert not torch.equal(other[other != 0], x[other != 0])
    assert not torch.equal(c.indices(200, 42), c.indices(200, 43))
    assert not torch.equal(c.indices(200, 42), RandomK(0.05, seed=1).indices(200, 42))
    assert c.indices(200, 42).unique().numel() == 10  # without replacement


def test_randomk_scaled_is_unbiased():
    d, copies, keys, ratio = 20, 20, 300, 0.25
    x = randn(d, seed=4)
    c = RandomK(ratio, scaled=True)
    # Averaging over keys and over identical copies inside one tensor: 6,000 samples per entry for
    # 300 calls (the calls, not the arithmetic, are what costs time).
    mean = (
        sum(c.compress(x.repeat(copies), key) for key in range(keys)).view(copies, d).mean(0) / keys
    )
    # C(x)_i = (d/k) x_i with probability k/d, else 0: Var = x_i² (d/k − 1); sampling without
    # replacement correlates the copies negatively, so this bound on the mean's spread is safe.
    k_over_d = round(ratio * d * copies) / (d * copies)
    std_of_mean = x.abs() * math.sqrt((1 / k_over_d - 1) / (copies * keys))
    assert ((mean - x).abs() <= 5 * std_of_mean + 1e-12).all()
    # Unscaled, it is the plain (biased) selection.
    assert torch.equal(RandomK(ratio).compress(x, 3) * 4, c.compress(x, 3))


def test_rescaled_scaled_randomk_is_the_plain_selection():
    x = randn(40, seed=12)
    scaled, plain = RandomK(0.25, seed=3, scaled=True), RandomK(0.25, seed=3)
    torch.testing.assert_close(
        scaled.compress(x, 9) / scaled.contraction_scale(40), plain.compress(x, 9)
    )


@pytest.mark.parametrize("shape", [(0,), (5, 0)])
@pytest.mark.parametrize("compressor", [TopK(0.3), RandomK(0.3), RandomK(0.3, scaled=True)])
def test_an_empty_tensor_sends_nothing_and_decodes_empty(compressor, shape):
    """A zero-sized parameter (k = 0 entries kept): no bytes, and an empty result, not an error
    (scaled random-k divided numel by k = 0)."""
    x = torch.zeros(shape)
    assert compressor.nbytes(x.shape, x.dtype) == 0
    assert compressor.compress(x, 7).shape == shape
