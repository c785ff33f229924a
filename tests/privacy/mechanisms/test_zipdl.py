"""ZIP-DL (`privacy.mechanisms.zipdl`): zero-sum noise per neighbour that leaves the network average
unchanged, a different message per neighbour, and its refusal of a topology schedule.

Threat model: a peer knows the whole config (the seed too), the code and every byte it receives.
"""

from __future__ import annotations

import math

import pytest
import torch

import topologies
from gossip_powersgd import ExactGossip, LocalCluster, PowerGossip
from gossip_powersgd.privacy.mechanisms import zipdl
from gossip_powersgd.privacy.seeds import Randomness
from mechanism_fixtures import small_config

U64 = 2.0**-53  # float64 unit roundoff
SHAPES = [(12, 9), (6, 3, 2, 2), (12,), (2, 2)]


def peer_tensors(comm, seed=7):
    g = torch.Generator().manual_seed(seed + comm.rank)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]


def test_zero_sum_noise_sums_to_zero_with_the_weights_and_differs_per_neighbour():
    weights = [0.29, 0.17, 0.2, 0.2, 0.14]
    noise = zipdl.zero_sum_noise(Randomness.os_entropy(), 3, weights, 4000, sigma=2.0)
    w = torch.tensor(weights, dtype=torch.float64)
    residual = (w[:, None] * noise).sum(0).abs().max()
    # The centre is a float64 weighted mean of deg terms (error <= deg u sum|w g| / sum w), and
    # the weighted sum of the deg centred rows adds as much again: bound 2 deg u sigma max|g| sum w.
    bound = 2 * len(weights) * U64 * float(noise.abs().max() + 2.0 * 9) * float(w.sum())
    assert residual <= bound
    # every row is noisy, each its own: std as `message_std` says, rows not equal
    for row, std in zip(noise, zipdl.message_std(weights, 2.0)):
        assert abs(float(row.std()) / std - 1) < 5 / math.sqrt(2 * 4000)  # 5 standard errors
    assert not torch.allclose(noise[0], noise[1])


def zipdl_run(comm, kind, steps, sigma, centred):
    x = peer_tensors(comm)
    before = [t.clone() for t in x]
    gossip = ExactGossip(x, comm) if kind == "exact" else PowerGossip(x, comm, rank=1)
    noise = zipdl.ZeroSumNoise(Randomness.os_entropy(), sigma)
    if not centred:  # the control: independent noise per message, not zero-sum

        def noise(counter, neighbors, weights, rows, _r=Randomness.os_entropy()):
            rows.add_(sigma * _r.normals(zipdl.ZIPDL_STREAM, counter, n=rows.numel()).view_as(rows))

    gossip.edge_noise = noise
    largest = 0.0
    for _ in range(steps):
        gossip.step()
        largest = max(largest, max(float(t.abs().max()) for t in x))
    return before, x, largest


@pytest.mark.parametrize("kind", ["exact", "powergossip"])
@pytest.mark.parametrize("spec", ["ring:8", "small_world:8:4:0.5"])
def test_zipdl_leaves_the_network_average_unchanged(kind, spec):
    topology, steps, sigma = topologies.parse(spec), 30, 0.5
    results = LocalCluster(topology).run(zipdl_run, kind, steps, sigma, True)
    largest = max(r[2] for r in results) + 10 * sigma  # models and noisy messages
    deg = max(len(list(topology.neighbors(i))) for i in range(topology.size))
    # Per step and coordinate each peer's mix rounds deg + 2 float64 terms of size <= largest,
    # and the noise's centring leaves <= 2 deg u sigma 10 (first test): the average drifts by
    # at most steps (deg + 2) u largest (plus the centring's share, inside `largest`).
    bound = steps * (deg + 2) * 2 * U64 * largest
    for k in range(len(SHAPES)):
        before = torch.stack([r[0][k] for r in results]).mean(0)
        after = torch.stack([r[1][k] for r in results]).mean(0)
        assert float((after - before).abs().max()) <= bound, (k, bound)
    # The control, independent noise per message, moves the average by ~ sigma gamma w / sqrt(n)
    # per step: far above the bound, so the assertion above can fail.
    control = LocalCluster(topology).run(zipdl_run, kind, steps, sigma, False)
    moved = max(
        float(
            (
                torch.stack([r[1][k] for r in control]).mean(0)
                - torch.stack([r[0][k] for r in control]).mean(0)
            )
            .abs()
            .max()
        )
        for k in range(len(SHAPES))
    )
    assert moved > 1e6 * bound


def test_zipdl_messages_differ_per_neighbour():
    def run(comm):
        x = peer_tensors(comm)
        gossip = ExactGossip(x, comm)
        gossip.edge_noise = zipdl.ZeroSumNoise(Randomness.os_entropy(), 0.1)
        sent = {}
        original = comm.exchange

        def spy(send, recv, *args):
            sent.update({j: t.clone() for j, t in send.items()})
            return original(send, recv, *args)

        comm.exchange = spy
        gossip.step()
        return sent

    sent = LocalCluster(topologies.ring(4)).run(run)
    a, b = sent[0].values()
    assert not torch.equal(a, b)
    assert torch.allclose(
        a + b, 2 * torch.cat([t.reshape(-1) for t in peer_tensors(type("C", (), {"rank": 0}))])
    )


def test_zipdl_on_a_schedule_is_refused_on_every_rank():
    from gossip_powersgd.training.trainer import train

    config = small_config(
        topology="one_peer_exponential:4", dp_mechanism="zipdl", dp_zipdl_sigma=0.1
    )
    with pytest.raises(Exception, match="zipdl needs a static topology"):
        LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config)
