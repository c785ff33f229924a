"""`membership.detected`: the survivors' agreement on a lost peer, through the rendezvous store —
every survivor appends the same epoch at the largest step any of them posted, with the largest
counters; a peer the others found lost ends with the rejoin hint; a store that is gone is one line.

The survivors run as threads of this process on a real `TCPStore` (what torch's rendezvous
gives): one of them found the loss itself, the others learn of it from the store."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist

import topologies
from gossip_powersgd.errors import CommunicationError
from gossip_powersgd.faults.liveness import PeerLost
from gossip_powersgd.membership.detected import DetectedChanges
from gossip_powersgd.membership.epochs import Membership

#: Seconds any wait here may take on a loaded machine (each wait ends as soon as it works).
WITHIN = 60.0


def survivor(store, rank: int, lost=(), topology="ring:4", epochs=()) -> DetectedChanges:
    """Rank `rank` of `topology` in the last of `epochs`, its monitor holding the losses `lost`
    ((peer, how) pairs), its algorithm counters 10 rank and 100 - rank."""
    membership = Membership(topologies.parse(topology), epochs)
    node = {"steps": 10 * rank, "half_steps": 100 - rank}
    peer = SimpleNamespace(
        rank=rank,
        membership=membership,
        epoch=membership.last,
        algorithm=SimpleNamespace(inner=SimpleNamespace(node_state=lambda: dict(node))),
        detected={},
    )
    losses = [(PeerLost(k, how, "localhost"), 100.0 + k) for k, how in lost]
    # (no monitor thread here: every loss is in `losses` from the start, nothing left to find)
    monitor = SimpleNamespace(losses=losses, removed=set(), local={}, finding_seconds=lambda: 0.0)
    return DetectedChanges(peer, store, monitor, WITHIN)


def step_until_agreed(driver: DetectedChanges, step: int, outcome: dict) -> None:
    """What the training loop does: `before_step` at each step until an epoch is appended (the
    loop would train the steps without gossip meanwhile; here the step stays)."""
    deadline, start = time.monotonic() + WITHIN, driver.peer.membership.last.number
    try:
        while driver.peer.membership.last.number == start and time.monotonic() < deadline:
            driver.before_step(step)
            time.sleep(0.01)
    except CommunicationError as exc:
        outcome["error"] = str(exc)


def run_together(drivers_and_steps):
    outcomes = [{} for _ in drivers_and_steps]
    threads = [
        threading.Thread(target=step_until_agreed, args=(d, s, o), daemon=True)
        for (d, s), o in zip(drivers_and_steps, outcomes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WITHIN)
    assert not any(t.is_alive() for t in threads)
    return outcomes


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_the_survivors_append_the_same_epoch_at_the_largest_posted_step(store, capsys):
    """Rank 0 found peer 2 killed at its step 6; ranks 1 and 3, at steps 9 and 7, learn it from
    the store. All three append epoch 1 = {0, 1, 3} at step 9 (none has started it), with each
    counter the largest posted (steps 30 from rank 3, half_steps 100 from rank 0)."""
    drivers = [survivor(store, 0, lost=[(2, "killed")]), survivor(store, 1), survivor(store, 3)]
    outcomes = run_together(list(zip(drivers, (6, 9, 7))))
    assert outcomes == [{}, {}, {}]
    for driver in drivers:
        epoch = driver.peer.membership.last
        assert (epoch.number, epoch.step, epoch.live) == (1, 9, (0, 1, 3))
        assert driver.peer.detected == {1: {"steps": 30, "half_steps": 100}}
        (change,) = driver.changes
        assert (change["epoch"], change["step"], change["lost"], change["by"]) == (
            1,
            9,
            {2: "killed"},
            0,
        )
        assert change["detected"] == 102.0  # the finder's time of detection, for everyone
    assert drivers[0].monitor.removed == {2}
    assert json.loads(store.get("membership/1/step")) == {"step": 9, "live": [0, 1, 3]}
    out = capsys.readouterr().out
    assert (
        out.count(
            "peer 2 (killed) lost; the survivors, peers 0,1,3, go on without it from "
            "step 9 (epoch 1)"
        )
        == 3
    )


def test_a_change_never_takes_effect_before_the_step_after_the_last_one(store):
    """Peer 4 left at step 5; peer 3 is found lost by survivors that posted steps 2 and 3 (at or
    before the last change): the change is at step 6, the first after it."""
    after = dict(topology="complete:5", epochs=[(5, [0, 1, 2, 3])])
    drivers = [survivor(store, 0, lost=[(3, "hung")], **after)]
    drivers += [survivor(store, k, **after) for k in (1, 2)]
    assert run_together(list(zip(drivers, (2, 3, 2)))) == [{}, {}, {}]
    for driver in drivers:
        epoch = driver.peer.membership.last
        assert (epoch.number, epoch.step, epoch.live) == (2, 6, (0, 1, 2))


def test_a_peer_the_others_found_lost_ends_with_the_rejoin_hint(store):
    """Rank 0 found peer 1 unreachable; peer 1 itself is alive and reaches the agreement: it is
    not in the proposal's members, so it ends, saying who saw it and how to take part again."""
    drivers = [survivor(store, 0, lost=[(1, "unreachable")])]
    drivers += [survivor(store, k) for k in (1, 2, 3)]
    outcomes = run_together([(drivers[0], 4), (drivers[2], 4), (drivers[3], 4)])
    assert outcomes == [{}, {}, {}]
    (lost,) = run_together([(drivers[1], 4)])
    assert lost["error"] == (
        "rank 1: the other peers found this peer lost (unreachable, seen by rank 0) and went on "
        "without it: it ends here (restart it with --rejoin 1 to take part again)"
    )


def test_a_store_that_is_gone_is_one_line_naming_what_must_survive():
    class Gone:
        def check(self, keys):
            raise RuntimeError("DistNetworkError: Connection reset by peer\n  at socket.cpp:42")

    driver = survivor(Gone(), 2)
    with pytest.raises(CommunicationError) as info:
        driver.interrupted()
    assert str(info.value) == (
        "rank 2: the rendezvous store is unreachable (DistNetworkError: Connection reset by "
        "peer): on_peer_loss: continue agrees on the membership through it, so its host "
        "(rank 0's process, or the first torchrun agent) must survive"
    )
