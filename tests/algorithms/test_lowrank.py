"""The shared low-rank pieces (algorithms/lowrank.py): a rank above the smaller side of every matrix
is clipped, with one warning; a compression rate that compresses no parameter is refused."""

import pytest
import torch

import topologies
from gossip_powersgd import (
    LocalCluster,
    PowerGossip,
)
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.algorithms.lowrank import orthonormalize_
from gossip_powersgd.utils import RunWarning
from tests.training.test_validation import HUGE, train_cli


def test_powergossip_clips_the_rank_to_the_smaller_side():
    """rank=50 on 4x3 matrices is rank 3 (documented): same bytes, same result, bit for bit."""

    def peer(comm, rank):
        g = torch.Generator().manual_seed(comm.rank)
        x = [
            torch.randn(4, 3, generator=g, dtype=torch.float64),
            torch.randn(3, 4, generator=g, dtype=torch.float64),
        ]
        gossip = PowerGossip(x, comm, rank=rank, seed=1)
        sizes = []
        for _ in range(3):
            sizes.append(gossip.bytes_per_step())
            gossip.step()
        return x, sizes, comm.stats.bytes_sent

    big = LocalCluster(topologies.ring(4)).run(peer, 50)
    three = LocalCluster(topologies.ring(4)).run(peer, 3)
    for (x_big, s_big, b_big), (x_3, s_3, b_3) in zip(big, three):
        assert s_big == s_3 and b_big == b_3 == sum(s_3)
        assert all(torch.equal(a, b) for a, b in zip(x_big, x_3))


def test_powergossip_rank_above_every_matrix_is_named_with_the_rank_it_takes(tmp_path):
    with pytest.warns(RunWarning) as caught:
        summary = train_cli(tmp_path, f"algorithm=powergossip:rank={HUGE}")
    (message,) = [str(w.message) for w in caught if w.category is RunWarning]
    assert message.startswith(
        f"powergossip: rank {HUGE} exceeds the smaller side of every parameter matrix (at most 4)"
    )
    assert "at rank min(rank, rows, cols)" in message
    assert summary["final_test_acc_avg_model"] > 0.25


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rank", [1, 2, 5])  # the rank-1 division, Gram-Schmidt, QR
def test_16_bit_factors_orthonormalise_and_a_zero_one_stays_zero(dtype, rank):
    """float16 rounds ORTHO_EPS (1e-8) to 0, so a zero vector was divided by 0 + 0 (NaN); torch has
    no 16-bit QR, so rank > 4 raised NotImplementedError."""
    zero = orthonormalize_(torch.zeros(2, rank, 7, dtype=dtype))
    assert torch.isfinite(zero).all()
    if rank <= 4:  # divided by (0 + eps): zero (QR turns it into some orthonormal set instead)
        assert not zero.any()
    g = torch.Generator().manual_seed(0)
    factor = torch.randn(2, rank, 7, generator=g).to(dtype)
    orthonormalize_(factor)
    gram = factor.float() @ factor.float().transpose(1, 2)
    # Each vector is stored rounded entrywise to the dtype (relative eps / 2 per entry), so |v|^2
    # is 1 only to about eps, and Gram-Schmidt's projections of these well-conditioned random
    # vectors add a few such roundings (about 2 eps seen): 8 eps, against O(1) if unnormalised.
    eps = torch.finfo(dtype).eps
    assert (gram - torch.eye(rank)).abs().max().item() <= 8 * eps


@pytest.mark.parametrize("rank", [1, 2, 5])
def test_powergossip_on_identical_float16_models_leaves_them_alone(rank):
    """Peers that start from the same model (the usual start) have D = 0 on every edge: the
    factor formed from it is zero and must stay zero, not turn into NaN (which stopped the run at
    its first step with 'non-finite values in the outgoing message')."""

    def peer(comm):
        x = [torch.linspace(-1, 1, 192).view(16, 12).half(), torch.ones(12).half()]
        start = [t.clone() for t in x]
        gossip = PowerGossip(x, comm, rank=rank)
        assert gossip.compressed_indices == {0}
        for _ in range(4):
            gossip.step()
        return [(a.float() - b.float()).abs().max().item() for a, b in zip(x, start)]

    # Both ends compute the same D = M_j Q - M_i Q = 0 only up to the products' rounding, which
    # the QR (rank 5) may normalise into unit factors: the update is then that rounding, at most
    # a few float16 ulps of |x| <= 1 per step.
    moved = LocalCluster(topologies.ring(4)).run(peer)
    assert max(max(m) for m in moved) <= 4 * 4 * torch.finfo(torch.float16).eps


def test_powersgd_on_a_zero_float16_gradient_gives_zero_not_nan():
    """A zero gradient (a frozen or unused layer) makes P = M Q zero: it must stay zero."""

    def peer(comm):
        params = [torch.nn.Parameter(torch.zeros(16, 12, dtype=torch.float16))]
        reducer = make_algorithm("powersgd:rank=1,start_iter=0", params, comm)
        for _ in range(2):
            params[0].grad = torch.zeros_like(params[0])
            reducer.step()
        return torch.equal(params[0].grad, torch.zeros_like(params[0]))

    assert all(LocalCluster(topologies.ring(3)).run(peer))


def test_a_rate_that_compresses_no_parameter_is_refused_at_set_up(tmp_path):
    """min_compression_rate=1e9 compresses nothing: the run would be exact gossip labelled
    PowerGossip. Refused in one line naming the largest rate (12x9 at rank 1: 108/21 = 5.142857)
    and a bound below which it compresses (5.142 does); the CLI set-up refuses it the same way."""

    def peer(comm, spec):
        x = [torch.randn(12, 9, dtype=torch.float64), torch.randn(7, dtype=torch.float64)]
        return make_algorithm(spec, x, comm).bytes_per_step()

    def bytes_of(spec):
        return LocalCluster(topologies.ring(3)).run(peer, spec)[0]

    with pytest.raises(
        ValueError, match=r"1e\+09 compresses no parameter \(the largest rate of th"
    ):
        bytes_of("powergossip:min_compression_rate=1e9")
    with pytest.raises(ValueError, match=r"at rank 1 is 5.14286\), .*below 5.142 \(1 compresses"):
        bytes_of("powergossip:min_compression_rate=5.143")
    assert bytes_of("powergossip:min_compression_rate=5.142") < bytes_of("exact")
    with pytest.raises(ValueError, match="compresses no parameter .* or use the algorithm exact$"):
        train_cli(tmp_path, "algorithm=powergossip:min_compression_rate=1e9")


def test_a_model_that_no_low_rank_form_makes_smaller_is_not_refused():
    """A 1x8 matrix and a vector get no smaller in low-rank form at any rank: exact gossip is then
    the cheaper message whatever the rate, and any rate is taken."""

    def peer(comm):
        x = [torch.randn(1, 8), torch.randn(5)]
        algorithm = make_algorithm("powergossip:min_compression_rate=1e9", x, comm)
        algorithm.step()
        return algorithm.bytes_per_step()

    assert all(b > 0 for b in LocalCluster(topologies.ring(3)).run(peer))
