"""metrics.py: the consensus distance, the parameter average and the mean degree a run's traffic
formula uses (their all-reduces are metric traffic), and a curve's error at matched bits, log-log
interpolated (moved from the consensus page's tests, where the curves themselves
are measured on the page's problems)."""

import math

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.metrics import (
    bits_to_reach,
    consensus_curve,
    consensus_distance,
    error_at_bits,
    mean_active_degree,
    parameter_average,
)

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


def test_mean_active_degree_of_a_static_ring_and_star_is_their_mean_degree():
    """Whatever the steps: a ring's 2, a star's 2 (n - 1) / n (4 + 4 x 1 over 5 peers)."""
    assert mean_active_degree(topologies.ring(5), 7) == 2
    assert mean_active_degree(topologies.parse("star:5"), 7) == pytest.approx(8 / 5, rel=1e-15)


def test_mean_active_degree_counts_each_steps_graph():
    assert mean_active_degree(topologies.parse("one_peer_exponential:16"), 10) == 1.0
    assert mean_active_degree(topologies.parse("ring:8"), 10) == 2.0
    assert mean_active_degree(topologies.parse("directed_exponential:8"), 5) == 1.0
    cyclic = topologies.parse("cyclic:ring:8,star:8")
    assert mean_active_degree(cyclic, 3) == pytest.approx((2 + 14 / 8 + 2) / 3)


def test_consensus_curve_is_the_error_against_the_transports_bits_until_reached():
    """Exact gossip on ring:4 (Metropolis weights 1/3: the squared error contracts by at least
    1/9 a step) reaches 1e-6 of its initial error within a few steps; every peer records the same
    curve, whose bits are 8 x the bytes the transport counted."""

    def peer(comm):
        x = torch.randn(6, 5, generator=torch.Generator().manual_seed(comm.rank))
        initial = consensus_distance([x.double()], comm)
        curve = consensus_curve(comm, "exact", [x.double()], 200, math.inf, stop_error=1e-6)
        return curve, initial, comm.stats.bytes_sent

    results = LocalCluster("ring:4").run(peer)
    curve, initial, sent = results[0]
    history = curve["history"]
    assert curve["stop"] == "reached" and len(history) < 20
    assert history[0]["error"] == initial and history[-1]["error"] <= 1e-6 * initial
    assert all(r[0]["history"] == history for r in results)
    assert history[-1]["bits_per_peer"] == 8 * sent == 8 * curve["bytes_sent"]


def _curve(points):
    return [{"step": k, "bits_per_peer": b, "error": e} for k, (b, e) in enumerate(points)]


def test_error_at_bits_is_log_log_interpolated_between_logged_steps():
    history = _curve([(0, 100.0), (10, 10.0), (1000, 0.1)])
    assert error_at_bits(history, 100) == pytest.approx(1.0)  # halfway in log-log
    assert error_at_bits(history, 10) == pytest.approx(10.0)
    assert error_at_bits(history, 5) is None  # before the first step
    assert error_at_bits(history, 2000) is None  # past the end of the run


def test_a_curve_that_reaches_exact_consensus_reaches_every_target():
    """An all-reduce reaches error exactly 0 in one step (the peers hold the same bits): that
    record was left out as not log-log placeable, so bits_to_reach said None ("never got there")
    for every target and error_at_bits None at that step's own bits. Both now count it: the step's
    bits, and between the steps around it the last logged step's error (what the budget holds)."""
    history = _curve([(0, 40.0), (4800, 0.0)])
    assert bits_to_reach(history, 1e-6) == 4800.0
    assert error_at_bits(history, 4800) == 0.0
    history = _curve([(0, 40.0), (100, 4.0), (4800, 0.0), (9600, 0.0)])
    assert bits_to_reach(history, 1e-6) == 4800.0 and bits_to_reach(history, 0.1) == 100.0
    assert error_at_bits(history, 1000) == 4.0  # within the budget: step 1's state
    assert error_at_bits(history, 4800) == 0.0 and error_at_bits(history, 5000) == 0.0


def test_bits_to_reach_interpolates_the_crossing_and_says_when_never():
    history = _curve([(0, 100.0), (10, 10.0), (1000, 0.1)])
    assert bits_to_reach(history, 1e-2) == pytest.approx(100.0)  # error 1 = 1e-2 x 100
    assert bits_to_reach(history, 0.5) == pytest.approx(10.0)  # already met at step 1
    assert bits_to_reach(history, 1e-4) is None
