"""experiments/pages/bench_scale/measure.py: every kind of exchange charges what it moves; the
gather reduction equals the ring average."""

from __future__ import annotations

import torch

import topologies
from experiments.pages.bench_scale import KINDS
from experiments.pages.bench_scale.measure import gather_reduce_, peer_point
from gossip_powersgd import LocalCluster
from gossip_powersgd.comm import ring_allreduce_bytes


def test_every_kind_charges_what_it_moves():
    n = 4
    records = LocalCluster(topologies.ring(n)).run(peer_point, KINDS, "100", 2)
    numel = records[0]["numel"]
    assert numel == 100
    for record in records:
        r = record["rank"]
        got = {row["kind"]: row for row in record["results"]}
        assert got["exact"]["bytes_sent"] == got["exact"]["bytes_received"] == 2 * numel * 4
        assert got["ring"]["bytes_sent"] == ring_allreduce_bytes(numel, 4, n, r)
        assert got["ring"]["bytes_received"] == ring_allreduce_bytes(numel, 4, n, (r - 1) % n)
        # The all-gather reduction receives every other peer's whole tensor.
        assert got["gather"]["bytes_received"] == got["gather"]["bytes_sent"] == (n - 1) * numel * 4
        assert got["powergossip"]["bytes_sent"] < got["exact"]["bytes_sent"] / 4
        assert all(row["seconds_per_step"] > 0 for row in record["results"])


def test_gather_reduction_equals_ring_average():
    def both(comm):
        x = torch.randn(37, generator=torch.Generator().manual_seed(comm.rank))
        return gather_reduce_(comm, x.clone()), comm.allreduce_(x.clone(), "mean")

    for gathered, ring in LocalCluster(topologies.ring(5)).run(both):
        torch.testing.assert_close(gathered, ring)
