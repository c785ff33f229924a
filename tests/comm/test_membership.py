"""comm/membership.py: the communicator of a run whose membership changes. (Collectives over the
live peers after a change, and transfer traffic in a run: tests/membership/test_peer.py.)"""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.comm.membership import MemberCommunicator


def test_in_the_first_epoch_it_is_the_transport_under_another_name():
    """Every peer a member: the same all-reduce bits and all-gather as the transport's own, one
    set of counters."""

    def peer(comm):
        member = MemberCommunicator(comm)
        value = torch.linspace(0, 1, 7, dtype=torch.float64) * (comm.rank + 1) / 3
        ours = member.allreduce_(value.clone(), op="mean")
        theirs = comm.allreduce_(value.clone(), op="mean")
        return (
            torch.equal(ours, theirs),
            member.allgather_bytes(bytes([comm.rank])) == comm.allgather_bytes(bytes([comm.rank])),
            member.stats is comm.stats,
            member.live,
            member.neighbors == comm.neighbors,
        )

    for result in LocalCluster(topologies.ring(4), cooperative=False).run(peer):
        assert result == (True, True, True, (0, 1, 2, 3), True)


def test_over_runs_the_collectives_inside_over_the_given_members_then_the_live_ones_again():
    """Live peers 0 and 2 of 3 (peer 1 has left); `over([0, 1, 2])` is the change's one
    collective that the leaving peer joins too, then the sums are over the live peers again."""
    repaired = topologies.repair(topologies.ring(3), [0, 2])

    def peer(comm):
        member = MemberCommunicator(comm)
        if comm.rank != 1:
            member.set_epoch(repaired, [2, 0], number=1)
        with member.over([2, 1, 0]):
            everyone = member.allreduce_(torch.tensor([float(comm.rank)]), op="sum")
        if comm.rank == 1:
            return float(everyone), None, member.live
        live = member.allreduce_(torch.tensor([float(comm.rank)]), op="sum")
        return float(everyone), float(live), member.live

    results = LocalCluster(topologies.ring(3), cooperative=False).run(peer)
    assert results[0] == results[2] == (3.0, 2.0, (0, 2))
    assert results[1] == (3.0, None, (0, 1, 2))


def test_a_transfer_counts_apart_refuses_a_strided_buffer_and_restores_the_deadline():
    def peer(comm):
        member = MemberCommunicator(comm)
        other = 1 - comm.rank
        send = {other: torch.full((3,), float(comm.rank), dtype=torch.float64)}
        recv = {other: torch.zeros(3, dtype=torch.float64)}
        timeout = comm.timeout
        member.transfer(send, recv, wait=True)
        assert comm.timeout == timeout  # the year-long wait was for that transfer only
        strided = {other: torch.zeros(3, 2, dtype=torch.float64)[:, 0]}
        with pytest.raises(ValueError, match=f"rank {comm.rank}: the receive buffer for peer "):
            member.transfer({}, strided)
        stats = comm.stats
        return (
            recv[other].tolist(),
            stats.transfer_bytes_sent,
            stats.transfer_messages_sent,
            (stats.bytes_sent),
        )

    results = LocalCluster(topologies.ring(2), timeout=30, cooperative=False).run(peer)
    assert results[0] == ([1.0] * 3, 24, 1, 0) and results[1] == ([0.0] * 3, 24, 1, 0)
