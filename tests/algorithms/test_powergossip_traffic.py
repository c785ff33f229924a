"""Traffic at the paper's model size: ResNet-20 on a ring of 8, measured on the transport.

PowerGossip sends, per round and neighbour, one factor of each matrix-shaped parameter (a
conv weight viewed as out x in*k*k: the m-vector P one round, the n-vector Q the next, with one
power iteration) and every vector-shaped parameter (BatchNorm weights and biases, the fc bias)
whole; exact gossip sends the whole model. On ResNet-20 that is ~56x fewer floats per round.
"""

import topologies
import torch

from gossip_powersgd import LocalCluster
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.training.models import build_model

ROUNDS = 4


def bytes_per_round(comm, spec):
    model = build_model("resnet20", (3, 32, 32), 10, seed=0)
    with torch.no_grad():  # peers differ (the bytes do not depend on the values)
        for p in model.parameters():
            p.add_(0.01 * comm.rank)
    algorithm = make_algorithm(spec, model.named_parameters(), comm)
    sent = []
    for _ in range(ROUNDS):
        before = comm.stats.bytes_sent
        algorithm.step()
        sent.append(comm.stats.bytes_sent - before)
    return sent


def measure(spec):
    return LocalCluster(topologies.parse("ring:8"), timeout=60).run(bytes_per_round, spec)


def test_powergossip_sends_56_times_fewer_floats_than_exact_gossip_on_resnet20():
    model = build_model("resnet20", (3, 32, 32), 10, seed=0)
    matrices = [(p.shape[0], p[0].numel()) for p in model.parameters() if p.ndim >= 2]
    vectors = sum(p.numel() for p in model.parameters() if p.ndim < 2)
    rows, cols = sum(m for m, _ in matrices), sum(n for _, n in matrices)
    per_float = 4 * 2  # float32 to each of the ring's 2 neighbours
    exact, powergossip = measure("exact"), measure("powergossip:rank=1")
    two_iterations, rank_two = measure("powergossip:rank=1,iters=2"), measure("powergossip:rank=2")
    for rank in range(8):
        assert exact[rank] == [272_474 * per_float] * ROUNDS
        assert powergossip[rank] == [(rows + vectors) * per_float, (cols + vectors) * per_float] * (
            ROUNDS // 2
        )
        assert two_iterations[rank] == [(rows + cols + vectors) * per_float] * ROUNDS
        assert rank_two[rank] == [
            (2 * rows + vectors) * per_float,
            (2 * cols + vectors) * per_float,
        ] * (ROUNDS // 2)
    ratio = sum(exact[0]) / sum(powergossip[0])
    assert 56.0 < ratio < 56.3  # 272,474 / ((794 + 5,755) / 2 + 1,578) = 56.15
