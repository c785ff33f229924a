"""The in-process cluster's turn-taking (`LocalCluster(..., cooperative=True)`): one peer runs at a
time, the results are bit for bit those of free-running threads, and nothing that fails or blocks
turns into a hang."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from gossip_powersgd import CommunicationError, ExactGossip, LocalCluster, PowerGossip
from gossip_powersgd.algorithms.base import all_finite
from gossip_powersgd.comm import local, local_shared


def _train_like(comm):
    """A few gossip steps of two algorithms and an all-reduce, returning everything they produce."""
    generator = torch.Generator().manual_seed(comm.rank)
    x = [torch.randn(12, 10, generator=generator), torch.randn(7, generator=generator)]
    y = [torch.randn(30, generator=generator)]
    power, exact = PowerGossip(x, comm, rank=2), ExactGossip(y, comm)
    mean = torch.randn(1000, generator=generator)
    for _ in range(6):
        power.step()
        exact.step()
        comm.allreduce_(mean)
    return [t.clone() for t in x + y] + [mean.clone()], comm.stats.as_dict()


@pytest.mark.parametrize("spec", ["ring:8", "torus:3x3", "one_peer_exponential:8"])
def test_taking_turns_gives_the_bits_and_bytes_of_free_threads(spec):
    free = LocalCluster(spec, cooperative=False).run(_train_like)
    turns = LocalCluster(spec, cooperative=True).run(_train_like)
    for (tensors_a, stats_a), (tensors_b, stats_b) in zip(free, turns):
        assert stats_a == stats_b
        assert all(torch.equal(a, b) for a, b in zip(tensors_a, tensors_b))


class _Overlap:
    """Counts the most threads ever inside `with overlap:` at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running = self.most = 0

    def __enter__(self):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)

    def __exit__(self, *exc):
        with self._lock:
            self.running -= 1


def _overlap(cooperative: bool, hold, lanes: int = 1) -> int:
    """The most peers ever inside their compute section (which calls `hold`) at once."""
    overlap = _Overlap()

    def peer(comm):
        send = {j: torch.full((3,), float(comm.rank)) for j in comm.neighbors}
        recv = {j: torch.empty(3) for j in comm.neighbors}
        for _ in range(8):
            with overlap:
                hold()
            comm.exchange(send, recv)
            assert all(float(recv[j][0]) == j for j in comm.neighbors)
        comm.allreduce_(torch.ones(5))

    LocalCluster("ring:8", cooperative=cooperative, lanes=lanes).run(peer)
    return overlap.most


def test_one_peer_runs_at_a_time_when_taking_turns():
    # The sleep lets the CPU and the GIL go while a peer holds the turn: threads that did not take
    # turns would enter the section meanwhile (it is not a timing assertion).
    assert _overlap(cooperative=True, hold=lambda: time.sleep(0.002)) == 1
    # The counter sees an overlap: free threads all meet inside the section.
    everyone = threading.Barrier(8)
    assert _overlap(cooperative=False, hold=lambda: everyone.wait(timeout=30)) == 8


def test_the_default_takes_turns_exactly_when_peers_outnumber_cores(monkeypatch):
    monkeypatch.setattr(local.os, "cpu_count", lambda: 4)
    assert LocalCluster("ring:5").cooperative and not LocalCluster("ring:4").cooperative
    assert not LocalCluster("ring:5", cooperative=False).cooperative


@pytest.fixture
def one_intra_op_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning threads needs Linux and two cores to choose from",
)
def test_peer_threads_taking_turns_are_pinned_to_the_intra_op_thread_count_of_cores(
    one_intra_op_thread,
):
    caller = os.sched_getaffinity(0)

    def cores(comm):
        comm.barrier()
        return frozenset(os.sched_getaffinity(0))

    pinned = LocalCluster("ring:4", cooperative=True).run(cores)
    assert len(set(pinned)) == 1 and len(pinned[0]) == 1 and pinned[0] <= caller
    assert LocalCluster("ring:4", cooperative=True, pin=False).run(cores) == [caller] * 4
    assert (
        LocalCluster("ring:4", cooperative=False, pin=True).run(cores) == [caller] * 4
    )  # free: never
    assert os.sched_getaffinity(0) == caller  # only the peer threads were pinned
    torch.set_num_threads(len(caller))
    assert (
        LocalCluster("ring:4", cooperative=True).run(cores) == [caller] * 4
    )  # as many as there are


def test_peer_cores_takes_the_count_asked_for_from_the_allowed_ones(monkeypatch):
    if not hasattr(os, "sched_setaffinity"):
        assert local.peer_cores(1) is None
        return
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 8, 9})
    for count in (1, 2, 3):
        [chosen] = local.peer_cores(count)
        assert len(chosen) == count and chosen <= {3, 5, 8, 9}
    assert local.peer_cores(4) is None and local.peer_cores(6) is None
    # lanes get cores of their own while there are enough, and share them after that
    first, second = local.peer_cores(2, lanes=2)
    assert len(first) == len(second) == 2 and not first & second and first | second == {3, 5, 8, 9}
    lanes = local.peer_cores(1, lanes=6)
    assert all(len(c) == 1 for c in lanes) and set().union(*lanes[:4]) == {3, 5, 8, 9}
    assert lanes[4] == lanes[0] and lanes[5] == lanes[1]


def _concurrent_pair(comm, meeting):
    """Peers 0 and 4 meet at a two-party barrier before their first exchange; the others gossip."""
    if comm.rank in (0, 4):
        meeting.wait(timeout=30)
    send = {j: torch.full((3,), float(comm.rank)) for j in comm.neighbors}
    recv = {j: torch.empty(3) for j in comm.neighbors}
    comm.exchange(send, recv)
    return all(float(recv[j][0]) == j for j in comm.neighbors)


@pytest.mark.timing
def test_two_lanes_run_one_peer_of_each_at_once_with_the_same_bits():
    # Peers 0 and 4 are in different lanes (ranks 0-3 and 4-7): each lane grants its own turn,
    # so both reach the barrier while holding their turns, and it opens at once. (With one lane
    # the first to arrive would hold the only turn, and the other would reach it only when its
    # patience runs out.)
    start = time.monotonic()
    assert all(
        LocalCluster("ring:8", cooperative=True, lanes=2).run(
            _concurrent_pair, threading.Barrier(2)
        )
    )
    assert time.monotonic() - start < local_shared._PATIENCE_SECONDS
    # Never more peers at once than lanes (the sleep lets the GIL go inside the section).
    assert _overlap(cooperative=True, hold=lambda: time.sleep(0.002), lanes=2) <= 2
    for spec in ("ring:8", "star:5"):
        one = LocalCluster(spec, cooperative=True).run(_train_like)
        two = LocalCluster(spec, cooperative=True, lanes=3).run(_train_like)
        for (tensors_a, stats_a), (tensors_b, stats_b) in zip(one, two):
            assert stats_a == stats_b
            assert all(torch.equal(a, b) for a, b in zip(tensors_a, tensors_b))


@pytest.mark.parametrize("lanes", [0, -1, 1.5, True, "2"])
def test_lanes_must_be_a_whole_number_of_at_least_one(lanes):
    with pytest.raises(ValueError, match="lanes must be a whole number >= 1"):
        LocalCluster("ring:4", lanes=lanes)


def test_lanes_apply_to_a_cluster_taking_turns_only():
    assert LocalCluster("ring:4", cooperative=True, lanes=2).lanes == 2
    assert LocalCluster("ring:4", cooperative=True, lanes=9).lanes == 4  # no more lanes than peers
    # Free threads have no lanes: asking for them is refused rather than silently ignored.
    with pytest.raises(
        ValueError,
        match=r"lanes=2 applies only when peers take turns, but "
        r"cooperative=False .* pass cooperative=True",
    ):
        LocalCluster("ring:4", cooperative=False, lanes=2)
    assert LocalCluster("ring:4", cooperative=False, lanes=1).lanes == 1


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning threads needs Linux and two cores to choose from",
)
def test_each_lane_is_pinned_to_cores_of_its_own(one_intra_op_thread):
    def cores(comm):
        comm.barrier()
        return frozenset(os.sched_getaffinity(0))

    pinned = LocalCluster("ring:4", cooperative=True, lanes=2).run(cores)
    assert pinned[0] == pinned[1] and pinned[2] == pinned[3] and not pinned[0] & pinned[2]
    assert all(len(c) == 1 for c in pinned)


@pytest.mark.timing
def test_a_peer_blocking_outside_the_communicator_delays_the_others_but_never_deadlocks(
    monkeypatch,
):
    """Each peer waits for an event that only the other one sets: the first to get the turn blocks
    with it, and the other runs without the turn once it has waited `patience` seconds."""
    monkeypatch.setattr(local_shared, "_PATIENCE_SECONDS", 0.3)
    arrived = [threading.Event(), threading.Event()]

    overlap = _Overlap()

    def peer(comm):
        arrived[comm.rank].set()
        assert arrived[1 - comm.rank].wait(timeout=30), "the other peer never ran"
        recv = {j: torch.empty(1) for j in comm.neighbors}
        comm.exchange({j: torch.ones(1) for j in comm.neighbors}, recv)
        for _ in range(5):  # the peer that ran without the turn takes turns again
            with overlap:
                time.sleep(
                    0.01
                )  # lets the GIL go: a peer still running without the turn would enter
            comm.exchange({j: torch.ones(1) for j in comm.neighbors}, recv)
        return float(recv[1 - comm.rank][0])

    begin = time.monotonic()
    assert LocalCluster("ring:2", cooperative=True).run(peer) == [1.0, 1.0]
    assert time.monotonic() - begin < 10
    assert overlap.most == 1


@pytest.mark.timing
def test_a_failing_peer_releases_everybody_waiting_for_a_turn_or_a_message():
    def peer(comm):
        send = {j: torch.zeros(4) for j in comm.neighbors}
        recv = {j: torch.empty(4) for j in comm.neighbors}
        for step in range(20):
            if comm.rank == 3 and step == 5:
                raise ValueError("peer 3 fails on purpose")
            comm.exchange(send, recv)

    begin = time.monotonic()
    with pytest.raises(ValueError, match="peer 3 fails on purpose"):
        LocalCluster("ring:8", timeout=60, cooperative=True).run(peer)
    assert time.monotonic() - begin < 10


@pytest.mark.timing
def test_a_silent_peer_is_named_by_its_neighbours_timeout():
    def peer(comm):
        if comm.rank == 0:
            return  # never sends
        comm.exchange(
            {j: torch.zeros(2) for j in comm.neighbors}, {j: torch.empty(2) for j in comm.neighbors}
        )

    begin = time.monotonic()
    with pytest.raises(CommunicationError, match="no message from neighbour 0 within 1 s"):
        LocalCluster("ring:4", timeout=1, cooperative=True).run(peer)
    assert time.monotonic() - begin < 10


def test_all_finite_takes_the_sum_shortcut_only_when_it_proves_finiteness():
    assert all_finite(torch.tensor([1.0, -2.0])) and all_finite(torch.empty(0))
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert not all_finite(torch.tensor([1.0, bad, 3.0]))
    assert not all_finite(torch.tensor([float("inf"), -float("inf")]))  # the sum is NaN
    # finite values whose sum overflows are finite
    assert all_finite(torch.tensor([3e38, 3e38]))
    assert all_finite(torch.tensor([60000.0, 60000.0], dtype=torch.float16))
    assert not all_finite(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16))
    assert all_finite(torch.ones(2, dtype=torch.float64)) and all_finite(torch.arange(3))
