"""Tests for gossip_powersgd.compressors.quantized: the sign compressor's layout and l1 norm, QSGD's
level packing, unbiasedness and second-moment bound."""

import math

import pytest
import torch

from compressor_fixtures import DTYPES, as_bytes_int, decode, encode, randn
from gossip_powersgd.compressors import QSGD, SignNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1, 7, 8, 9, 13, 100])
def test_sign_norm_layout_and_l1(dtype, d):
    x = randn(d, dtype=dtype, seed=d)
    x[0] = 0.0  # sign(0) is +
    c = SignNorm()
    payload = encode(c, x)
    item = x.element_size()
    assert payload.numel() == item + math.ceil(d / 8)
    scale = payload[:item].clone().view(dtype)[0]
    assert scale == x.abs().sum() / d
    bits = sum(1 << i for i in range(d) if x[i] < 0)
    assert as_bytes_int(payload[item:]) == bits  # LSB-first, padding bits zero
    y = decode(c, payload, x)
    assert torch.equal(y, torch.where(x < 0, -scale, scale))
    assert torch.allclose(
        y.abs().sum(), x.abs().sum(), rtol=1e-6 if dtype == torch.float32 else 1e-14
    )


@pytest.mark.parametrize("levels", [1, 2, 3, 15, 16, 255])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qsgd_level_packing(levels, dtype):
    d = 37  # d·b is not a multiple of 8 for any of these b
    x = randn(d, dtype=dtype, seed=levels)
    x[5] = 0.0
    c = QSGD(levels)
    b = math.ceil(math.log2(levels + 1)) + 1
    payload = encode(c, x, key=9)
    item = x.element_size()
    assert payload.numel() == item + math.ceil(d * b / 8)
    norm = payload[:item].clone().view(dtype)[0]
    assert torch.allclose(norm, torch.linalg.vector_norm(x))
    y = decode(c, payload, x, key=9)
    level = torch.round(y.abs() * levels / norm).long()
    scaled = x.abs() * levels / norm
    # ξ is one of the two integers around s|x|/‖x‖ and the sign survives.
    assert ((level == scaled.floor()) | (level == scaled.ceil())).all()
    assert (level <= levels).all() and y[5] == 0
    assert (torch.sign(y) * torch.sign(x) >= 0).all()
    assert torch.allclose(y, torch.sign(x) * level * norm / levels)
    # Bit layout: code = level | sign << (b−1), entry i at bits i·b.. of a little-endian stream.
    codes = [int(level[i]) | (int(x[i] < 0) << (b - 1)) for i in range(d)]
    assert as_bytes_int(payload[item:]) == sum(code << (i * b) for i, code in enumerate(codes))


@pytest.mark.parametrize("levels", [1, 4])
def test_qsgd_is_unbiased(levels):
    d, copies, keys = 16, 20, 300
    x = randn(d, seed=6)
    c = QSGD(levels)
    xs = x.repeat(copies)
    mean = sum(c.compress(xs, key) for key in range(keys)).view(copies, d).mean(0) / keys
    norm = torch.linalg.vector_norm(xs)
    p = x.abs() * levels / norm
    p = p - p.floor()
    # ξ is floor(·) + Bernoulli(p), independently per entry: Var(C_i) = (‖x‖/s)² p(1−p).
    std_of_mean = norm / levels * torch.sqrt(p * (1 - p) / (copies * keys))
    assert ((mean - x).abs() <= 5 * std_of_mean + 1e-12).all()


def test_qsgd_zero_vector():
    x = torch.zeros(10, dtype=torch.float64)
    assert torch.equal(QSGD(4).compress(x), x)


@pytest.mark.parametrize("levels", [1, 2, 4])
def test_qsgd_second_moment_is_within_its_bound(levels):
    """E‖C(x)‖² <= (1 + ω)‖x‖² (Alistarh et al., Lemma 3.1), estimated over 400 keys."""
    x = randn(50, seed=11)
    second = torch.stack(
        [QSGD(levels).compress(x, key).square().sum() for key in range(400)]
    ).mean()
    assert second <= (1 + QSGD(levels).variance_bound(50)) * x.square().sum()
    assert second > 1.5 * x.square().sum()  # and far from contractive: the rescaling is needed


def test_qsgd_of_a_float16_tensor_whose_norm_float16_cannot_hold_stays_finite_and_unbiased():
    """4,900 entries of 1000 fit float16, their norm 70,000 does not (largest 65,504): stored in
    float16 it was inf and every decoded entry 0 * inf = nan. Stored in float32 (4 bytes), each
    entry decodes to 0 or norm / 4 = 17,500 (17,504 in float16; ξ ∈ {0, 1}: s|x_i|/‖x‖ = 0.057),
    whose mean over the 4,900 entries is within 5 standard deviations of 1000,
    5 * 17,500 * sqrt(p (1 - p) / 4,900) = 289 (float16's 4 in 17,500 moves it by 0.23)."""
    x = torch.full((70, 70), 1000.0, dtype=torch.float16)
    c = QSGD(4)
    payload = encode(c, x, key=1)
    assert payload.numel() == c.nbytes(x.shape, x.dtype) == 4 + 4900 * 4 // 8
    norm = float(payload[:4].clone().view(torch.float32)[0])
    assert math.isclose(norm, 70000.0, rel_tol=1e-6)  # float32's sum of 4,900 squares
    y = decode(c, payload, x, key=1).float()
    assert torch.isfinite(y).all()
    assert set(y.unique().tolist()) <= {0.0, float(torch.tensor(norm / 4).half())}  # 17,504
    p = 1000.0 * 4 / norm
    assert abs(float(y.mean()) - 1000.0) <= 5 * norm / 4 * math.sqrt(p * (1 - p) / 4900)
