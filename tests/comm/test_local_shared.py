"""comm/local_shared.py: the in-memory medium of a LocalCluster run — a barrier whose completed
rounds stay completed when it is broken afterwards, a timeout that breaks it for everyone, a FIFO
mailbox per (source, destination, channel), and an abort that names the first failing peer."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from gossip_powersgd.comm.local_shared import _Barrier, _Shared


def test_a_completed_round_stays_completed_when_the_barrier_is_broken_right_after():
    """threading.Barrier would fail the waiter that has not woken up yet; here it returns. The
    condition's (reentrant) lock is held across the last arrival and the abort, so the first waiter
    can only wake after the abort: the interleaving threading's barrier gets wrong, every time."""
    barrier = _Barrier(2)
    outcome = []

    def first():
        try:
            barrier.wait(timeout=60)
            outcome.append("returned")
        except threading.BrokenBarrierError:
            outcome.append("broken")

    waiter = threading.Thread(target=first)
    waiter.start()
    deadline = time.monotonic() + 60  # a poll for the waiter's arrival, never an endless one
    while True:
        assert time.monotonic() < deadline, "the first waiter never reached the barrier"
        with barrier._cond:
            if barrier._arrived == 1:  # the first waits (in the condition, its lock released)
                barrier.wait()  # the last arrival completes the round
                barrier.abort()
                break
        time.sleep(0.001)
    waiter.join(60)
    assert outcome == ["returned"]
    with pytest.raises(threading.BrokenBarrierError):
        barrier.wait()  # the next round is broken


def test_a_timeout_breaks_the_barrier_for_everyone():
    barrier = _Barrier(3)
    with pytest.raises(threading.BrokenBarrierError):
        barrier.wait(timeout=0.01)  # the others never come
    with pytest.raises(threading.BrokenBarrierError):
        barrier.wait(timeout=60)  # a later waiter fails at once instead of waiting


def test_each_channel_of_each_pair_is_its_own_fifo_and_the_first_abort_is_the_one_named():
    shared = _Shared(3)
    a, b, c = (torch.tensor([float(v)]) for v in (1, 2, 3))
    shared.post(0, 1, a)
    shared.post(0, 1, b)
    shared.post(0, 1, c, channel="members")
    shared.post(2, 1, c)
    assert [shared.mailbox(0, 1).get_nowait() for _ in range(2)] == [a, b]
    assert shared.mailbox(0, 1, "members").get_nowait() is c
    assert shared.mailbox(2, 1).get_nowait() is c
    assert shared.mailbox(1, 0).empty()
    shared.abort(2)
    shared.abort(0)
    assert shared.aborted.is_set() and shared.failed_rank == 2
    with pytest.raises(threading.BrokenBarrierError):
        shared.barrier.wait(timeout=60)
