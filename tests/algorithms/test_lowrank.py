"""The shared low-rank pieces (algorithms/lowrank.py): a rank above the smaller side of every matrix
is clipped, with one warning."""

import pytest
import torch

import topologies
from gossip_powersgd import (
    LocalCluster,
    PowerGossip,
)
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
