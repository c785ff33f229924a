"""Tests for gossip_powersgd.compressors.lowrank: exact on rank-r matrices, zero on zero, factors only
when they are smaller, and more iterations approach the best rank-r approximation."""

import math

import pytest
import torch

from compressor_fixtures import DTYPES, randn
from gossip_powersgd.compressors import LowRank


@pytest.mark.parametrize("r", [1, 2, 3])
@pytest.mark.parametrize("shape", [(30, 40), (16, 8, 3, 3)])
def test_lowrank_exact_on_rank_r(r, shape):
    rows, cols = shape[0], math.prod(shape[1:])
    m = (randn(rows, r, seed=r) @ randn(cols, r, seed=10 + r).T).reshape(shape)
    c = LowRank(r)
    assert c.nbytes(shape, torch.float64) == r * (rows + cols) * 8
    for key in range(3):
        assert torch.allclose(c.compress(m, key), m, atol=1e-10 * m.abs().max())
    # Higher rank than needed is still exact.
    assert torch.allclose(LowRank(r + 2).compress(m, 0), m, atol=1e-10 * m.abs().max())


def test_lowrank_zero_matrix_gives_zeros():
    for dtype in DTYPES:
        x = torch.zeros(20, 30, dtype=dtype)
        for c in (LowRank(1), LowRank(3, iterations=2)):
            y = c.compress(x, 0)
            assert not torch.isnan(y).any()
            assert torch.equal(y, x)


def test_lowrank_sends_exactly_what_does_not_pay_to_factor():
    c = LowRank(2)
    for shape in [
        (50,),
        (),
        (0, 4),
        (3, 3),
        (2, 100),
    ]:  # last: rank 2 of a 2-row matrix is all of it
        x = randn(*shape, seed=8)
        assert c.nbytes(x.shape, x.dtype) == x.numel() * 8
        assert torch.equal(c.compress(x), x)


def test_lowrank_more_iterations_approach_best_rank_r():
    u, _ = torch.linalg.qr(randn(40, 40, seed=1))
    v, _ = torch.linalg.qr(randn(60, 40, seed=2))
    m = u @ torch.diag(0.7 ** torch.arange(40.0, dtype=torch.float64)) @ v.T
    best = torch.linalg.svdvals(m)[2:].norm()  # Eckart–Young: the optimal rank-2 error
    errors = [torch.linalg.norm(LowRank(2, iterations=i).compress(m, 0) - m) for i in (1, 3, 10)]
    assert errors[0] >= errors[1] >= errors[2]
    assert errors[2] <= best * 1.001


def test_lowrank_float32():
    m = (randn(30, 2, seed=1) @ randn(50, 2, seed=2).T).float()
    assert torch.allclose(LowRank(2).compress(m, 0), m, atol=1e-4)


def test_lowrank_of_a_float16_matrix_whose_factor_float16_cannot_hold_stays_exact():
    """A rank-1 70 x 70 float16 matrix, 32 * i * j with integers i < 32, j < 64: every entry (at
    most 62,496) is exact in float16, but Q = Mᵀ P has entries up to ‖M‖₂ ≈ 1e7, inf in float16
    (largest 65,504), and C(M) was inf. With P's and Q's columns balanced, C(M) = M up to three
    float16 roundings (P, Q, the result: 2^-11 relative each) and float32's QR: within 4 * 2^-11
    of |M| entrywise."""
    g = torch.Generator().manual_seed(3)
    i, j = torch.randint(1, 32, (70,), generator=g), torch.randint(1, 64, (70,), generator=g)
    exact = 32.0 * torch.outer(i, j).float()
    m = exact.half()
    assert torch.equal(m.float(), exact)
    for c in (LowRank(1), LowRank(2, iterations=2)):
        y = c.compress(m, key=5).float()
        assert torch.isfinite(y).all()
        assert ((y - exact).abs() <= 4 * 2**-11 * exact).all(), float((y - exact).abs().max())
