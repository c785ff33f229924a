"""gossip_powersgd/consensus_problems: the consensus problems' closed forms (the spectral problem's
singular values and norm, the low-rank problem's rank, the offset problem's consensus distance),
seeding, and one-line errors for bad names. The trained-models problem is read back in
tests/experiments/pages/consensus/test_instance.py, beside the hook that saves the models."""

from __future__ import annotations

import math

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, consensus_distance
from gossip_powersgd import consensus_problems as problems

torch.set_num_threads(1)


def test_problems():
    assert problems.problem_shapes("matrix") == [(100, 100)]
    assert problems.problem_shapes("cnn") == [
        (32, 1, 5),
        (32,),
        (32, 32, 5),
        (32,),
        (32, 32, 5),
        (32,),
        (10, 128),
        (10,),
    ]
    a, b = problems.make_problem("matrix", 0), problems.make_problem("matrix", 1)
    assert a[0].dtype == torch.float32 and not torch.equal(a[0], b[0])
    assert torch.equal(a[0], problems.make_problem("matrix", 0)[0])


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_spectral_problem_has_the_stated_singular_values_and_norm(alpha):
    n = 30
    (x,) = problems.make_problem(f"spectral:alpha={alpha},n={n}", 3, torch.float64, seed=1)
    expected = problems.spectral_values(alpha, n)
    kappa = n / math.sqrt(sum(k ** (-2 * alpha) for k in range(1, n + 1)))
    assert torch.allclose(expected, kappa * torch.arange(1, n + 1, dtype=torch.float64) ** -alpha)
    assert torch.allclose(torch.linalg.svdvals(x), expected, rtol=1e-10, atol=1e-10)
    # ||X_i||^2 = n^2: the expected squared norm of the N(0,1) matrix problem of the same size.
    assert float(x.square().sum()) == pytest.approx(n * n, rel=1e-12)
    matrix = [problems.make_problem(f"matrix:{n}", r, torch.float64)[0] for r in range(64)]
    assert sum(float(m.square().sum()) for m in matrix) / 64 == pytest.approx(n * n, rel=0.02)
    other = problems.make_problem(f"spectral:alpha={alpha},n={n}", 4, torch.float64, seed=1)[0]
    assert not torch.equal(x, other)  # each peer its own U_i, V_i


@pytest.mark.parametrize("r", [1, 4])
def test_lowrank_differences_have_rank_at_most_r_without_noise(r):
    n = 24
    xs = [
        problems.make_problem(f"lowrank:r={r},sigma=0,n={n}", i, torch.float64)[0] for i in range(5)
    ]
    for i in range(1, 5):
        assert int(torch.linalg.matrix_rank(xs[i] - xs[0])) <= r
    noisy = [
        problems.make_problem(f"lowrank:r={r},sigma=0.1,n={n}", i, torch.float64)[0]
        for i in range(2)
    ]
    assert int(torch.linalg.matrix_rank(noisy[1] - noisy[0])) == n  # the noise is full rank


def _distance(comm, problem, seed):
    return consensus_distance(problems.make_problem(problem, comm.rank, torch.float64, seed), comm)


def test_offset_problem_has_the_matrix_problems_consensus_distance():
    cluster = LocalCluster(topologies.parse("ring:4"))
    plain = cluster.run(_distance, "matrix", 2)[0]
    shifted = cluster.run(_distance, "offset:beta=10", 2)[0]
    assert shifted == pytest.approx(plain, rel=1e-12)
    a = problems.make_problem("offset:beta=10", 0, torch.float64, seed=2)[0]
    b = problems.make_problem("matrix", 0, torch.float64, seed=2)[0]
    assert float((a - b).square().mean()) == pytest.approx(100, rel=0.05)  # beta^2 x N(0,1)
    offset0 = problems.make_problem("offset:beta=0", 1, seed=2)[0]
    assert torch.equal(offset0, problems.make_problem("matrix", 1, seed=2)[0])


def test_seed_zero_is_the_original_problem_and_seeds_differ():
    generator = torch.Generator().manual_seed(42 + 3)
    original = torch.randn((100, 100), generator=generator, dtype=torch.float64).float()
    assert torch.equal(problems.make_problem("matrix", 3)[0], original)
    assert not torch.equal(problems.make_problem("matrix", 3, seed=1)[0], original)


@pytest.mark.parametrize(
    "name, message",
    [
        ("spectral", "give alpha="),
        ("spectral:alpha=x", "not a number"),
        ("lowrank:r=4", "give sigma="),
        ("lowrank:r=0,sigma=0", "integer >= 1"),
        ("offset:gamma=1", "bad option"),
        ("nope", "valid:"),
        ("models:epoch=2.5", "integer"),
        ("lowrank:r=200,sigma=0", "r must be <="),
        ("lowrank:r=2,sigma=-1", "sigma must be >= 0"),
        ("spectral:alpha=1,n=inf", "n='inf' must be a finite number"),
        ("spectral:alpha=1,n=nan", "n='nan' must be a finite number"),
        ("lowrank:r=inf,sigma=0", "r='inf' must be a finite number"),
        ("models:epoch=1e400", "epoch='1e400' must be a finite number"),
        ("spectral:alpha=nan", "alpha='nan' must be a finite number"),
        ("offset:beta=1,beta=2", "beta is given twice"),
    ],
)
def test_bad_problem_names_are_one_line_errors(name, message):
    with pytest.raises(ValueError, match=message) as info:
        problems.parse_problem(name)
    assert "\n" not in str(info.value)


def test_a_size_whose_building_needs_more_than_the_bound_is_refused_in_one_line():
    """n=100000 is 80 GB per float64 matrix, and spectral builds 5 at once: refused at parsing (so
    before anything is allocated) naming the memory and the largest size under MAX_BUILD_BYTES
    (4 GiB: floor(sqrt(2^32 / (5 x 8))) = 10362); that size itself is accepted (only parsed here:
    building it takes 4 GiB). The shapes come first: on the old code they fail without building."""
    assert problems.problem_shapes("lowrank:r=1,sigma=0,n=10362") == [(10362, 10362)]
    with pytest.raises(ValueError, match=r"4 GiB: use n <= 10362$"):
        problems.problem_shapes("lowrank:r=1,sigma=0,n=10363")
    assert problems.problem_shapes("matrix:16384") == [(16384, 16384)]  # 2 x 2 GiB
    with pytest.raises(ValueError, match=r"rows x cols <= 268435456 \(matrix:16384\)$"):
        problems.problem_shapes("matrix:100000x100000")
    with pytest.raises(
        ValueError,
        match=r"^problem 'spectral:alpha=1,n=100000': building it needs about 373 GiB per peer "
        r"\(5 float64 100000x100000 matrices at once\), above the bound of 4 GiB: use n <= 10362$",
    ):
        problems.make_problem("spectral:alpha=1,n=100000", 0)
