"""The reference PowerGossip (`algorithms.reference`): its own closed forms, and every fast variant
of `PowerGossip` (static and scheduled, batched and per neighbour, the rank-1 row layout, Gram-
Schmidt and QR ranks, warm start and random restart, several half-steps per step) landing on it to
within the rounding that the conditioning of each half-step allows."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, make_algorithm
from gossip_powersgd.algorithms.lowrank import ORTHO_EPS
from gossip_powersgd.algorithms.reference import reference_powergossip

# Two same-shape matrices (one group of two), a conv weight (6 x 12), two biases and a matrix too
# small to compress: stacked groups, exactly gossiped tensors, and the compression rule at once.
SHAPES = [(12, 9), (12, 9), (6, 3, 2, 2), (12,), (2, 2), (6,)]
UNIT = torch.finfo(torch.float64).eps / 2


def start(rank: int, shapes=SHAPES):
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes]


def rounding_bound(factor, mi, mj) -> float:
    """How far two correct float64 implementations of one PowerGossip half-step on edge (i, j) may
    land apart, to first order: the models may differ by up to this after the update.

    The factor F about to be orthonormalised (columns) was computed as a difference of products,
    F = (M_j - M_i) X with X the previous orthonormal factor, and another implementation (batched
    bmm, another BLAS kernel, AVX-512 vs AVX2) sums those products in another order. Each entry
    then differs by up to a = c·u·(|M_i| + |M_j|) (u = 2^-53, c = the dot products' length, the
    standard forward-error bound of a dot product; |X| <= 1). Gram-Schmidt then moves the k-th
    normalised direction by up to m_k = (a + |v_k| · sum_{j<k} m_j) / |v_k⊥|: the vector's own
    perturbation a, plus what the earlier directions' moves do to its projection, divided by
    |v_k⊥| = |R_kk|, what is left of the k-th vector after removing the previous ones (the code
    divides by norm + ORTHO_EPS, so never by less than ORTHO_EPS). The update P·Pᵀ·D (or D·Q·Qᵀ)
    moves by up to 2 · sum_k m_k · |D|, D = M_j - M_i. When D is nearly rank-1, the second vector of
    a rank-2 factor is almost parallel to the first, |R_11| is tiny and the normalised second
    direction is barely determined by the data: that is the conditioning, not a bug of either side.
    The bound adds up over half-steps: gossip with a doubly stochastic W and gamma = 1 does not
    amplify model differences, and the warm-started factors carry earlier errors forward only at
    second order.
    """
    length = max(factor.shape[0], *mi.shape)
    absolute = length * UNIT * (torch.linalg.matrix_norm(mi) + torch.linalg.matrix_norm(mj)).item()
    r = torch.linalg.qr(factor, mode="r")[1]
    left = r.diagonal().abs().clamp(min=ORTHO_EPS).tolist()
    lengths = torch.linalg.vector_norm(factor, dim=0).tolist()
    moved = []  # how far each normalised direction may move
    for k in range(len(left)):
        moved.append((absolute + lengths[k] * sum(moved)) / left[k])
    return 2.0 * sum(moved) * torch.linalg.matrix_norm(mj - mi).item()


def reference_with_bound(topology, steps, shapes=SHAPES, **options):
    """The reference's models, and how far a correct fast variant may land from them: the
    half-steps' `rounding_bound`s, plus, for the exactly gossiped tensors, (deg + 2) u per step on
    each of the 2 max|x| terms (the mixing sum, in another order; gamma = 1 and a doubly
    stochastic W keep max|x| at most its start)."""
    models = [start(i, shapes) for i in range(topology.size)]
    largest = max(t.abs().max().item() for model in models for t in model)
    bound = [0.0]

    def on_half_step(edge, k, factor, m_small, m_big):
        bound[0] += rounding_bound(factor, m_small, m_big)

    reference_powergossip(models, topology, steps, on_half_step=on_half_step, **options)
    degree = max(len(topology.union.neighbors(i)) for i in range(topology.size))
    return models, bound[0] + steps * (degree + 2) * UNIT * 2 * largest


def fast(comm, spec, steps, shapes=SHAPES):
    xs = start(comm.rank, shapes)
    algorithm = make_algorithm(spec, xs, comm)
    for _ in range(steps):
        algorithm.step()
    return xs


TOPOLOGIES = [
    "ring:8",
    "star:5",
    "small_world:8:4:0.5",  # static: sign runs on both sides of a rank
    "one_peer_exponential:8",
    "matchings:8",
    "edge_sampling:ring:8:0.5",
]
VARIANTS = [
    dict(rank=1, num_iterations=1, warm_start=True),  # the rank-1 row layout
    dict(rank=2, num_iterations=3, warm_start=True),  # Gram-Schmidt, both sides per step
    dict(rank=5, num_iterations=2, warm_start=False),
]  # QR, random restart


@pytest.mark.parametrize("spec", TOPOLOGIES)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("variant", VARIANTS, ids=["r1", "r2K3", "r5restart"])
def test_every_fast_variant_lands_on_the_reference(spec, batched, variant):
    topology, steps = topologies.parse(spec), 5
    text = (
        f"powergossip:rank={variant['rank']},iters={variant['num_iterations']},"
        f"warm={variant['warm_start']},batched={batched},gamma=1"
    )
    out = LocalCluster(topology).run(fast, text, steps)
    expected, tolerance = reference_with_bound(topology, steps, gamma=1.0, **variant)
    # The tolerance is the conditioning's (see rounding_bound), not a tuned constant; a wrong
    # sign, weight, side or draw is orders of magnitude outside it (checked below).
    worst = max(
        (a - b).abs().max().item() for got, want in zip(out, expected) for a, b in zip(got, want)
    )
    assert worst <= tolerance, f"largest difference {worst:.3g}, rounding bound {tolerance:.3g}"
    moved = max((a - b).abs().max().item() for got in out for a, b in zip(got, start(0)))
    assert moved > 1e3 * tolerance  # the models did change: the comparison is not vacuous


def test_a_wrong_variant_is_far_outside_the_bound():
    topology = topologies.parse("edge_sampling:ring:8:0.5")
    out = LocalCluster(topology).run(fast, "powergossip:rank=2,iters=3,gamma=1", 5)
    for wrong in (
        dict(gamma=1.0 + 1e-6),
        dict(gamma=1.0, seed=1),
        dict(gamma=1.0, warm_start=False),
    ):
        expected, tolerance = reference_with_bound(topology, 5, rank=2, num_iterations=3, **wrong)
        worst = max(
            (a - b).abs().max().item()
            for got, want in zip(out, expected)
            for a, b in zip(got, want)
        )
        assert worst > 10 * tolerance, wrong


def test_the_reference_preserves_the_average_and_removes_the_projected_difference():
    topology = topologies.parse("edge_sampling:ring:8:0.5")
    models = [start(i) for i in range(8)]
    reference_powergossip(models, topology, 6, rank=2, num_iterations=2)
    for k in range(len(SHAPES)):
        before = sum(start(i)[k] for i in range(8)) / 8
        after = sum(m[k] for m in models) / 8
        assert (before - after).abs().max().item() <= 1e-12  # §7.1 in float64
    # Two peers, W = 1/2, gamma = 1, a square matrix at full rank: the right half-step's Q is
    # orthonormal and square, so D Q Q^T = D and both ends move to the average (to rounding).
    pair = topologies.parse("complete:2")
    models = [start(i, [(5, 5)]) for i in range(2)]
    mean = (models[0][0] + models[1][0]) / 2
    reference_powergossip(models, pair, 1, rank=5, gamma=1.0, min_compression_rate=0)
    for model in models:
        assert (model[0] - mean).abs().max().item() <= 1e-13  # 5-term dot products of O(1) values
