"""metrics.py: the consensus distance, the parameter average and the mean degree a run's traffic
formula uses; their all-reduces are metric traffic."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.metrics import consensus_distance, mean_active_degree, parameter_average

EPS64 = torch.finfo(torch.float64).eps


def peer_params(rank):
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(3, 2, generator=g), torch.randn(4, generator=g, dtype=torch.float64)]


def test_consensus_distance_is_the_mean_squared_distance_to_the_average_and_metric_traffic():
    """Closed form in float64 over 4 peers of 10 numbers each: sums of ~40 terms of order 1, so
    within 64 float64 roundings; the same value on every peer; no training bytes."""
    every = [torch.cat([t.double().reshape(-1) for t in peer_params(r)]) for r in range(4)]
    mean = torch.stack(every).mean(0)
    expected = float(sum(((x - mean) ** 2).sum() for x in every) / 4)

    def peer(comm):
        distance = consensus_distance(peer_params(comm.rank), comm)
        average = parameter_average(peer_params(comm.rank), comm)
        return distance, average, comm.stats.bytes_sent, comm.stats.metric_bytes_sent

    results = LocalCluster(topologies.ring(4), cooperative=False).run(peer)
    assert len({r[0] for r in results}) == 1
    for distance, average, training, metric in results:
        assert distance == pytest.approx(expected, rel=64 * EPS64)
        torch.testing.assert_close(average, mean, rtol=0, atol=16 * EPS64)
        assert training == 0 and metric > 0


def test_equal_models_are_at_distance_zero_exactly():
    def peer(comm):
        return consensus_distance([torch.full((5,), 0.1)], comm)

    assert LocalCluster(topologies.ring(3), cooperative=False).run(peer) == [0.0] * 3


def test_mean_active_degree_counts_each_steps_graph():
    assert mean_active_degree(topologies.parse("one_peer_exponential:16"), 10) == 1.0
    assert mean_active_degree(topologies.parse("ring:8"), 10) == 2.0
    assert mean_active_degree(topologies.parse("directed_exponential:8"), 5) == 1.0
    cyclic = topologies.parse("cyclic:ring:8,star:8")
    assert mean_active_degree(cyclic, 3) == pytest.approx((2 + 14 / 8 + 2) / 3)
