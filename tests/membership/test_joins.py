"""`gossip-train --rejoin`'s refusals (membership/joins.py), each one line naming the problem,
on a real c10d TCPStore of this process: a request whose config differs from the members', a join
the members could only agree at or past the run's end, a run that ended before or during the
request, and a peer the others have not removed. The members' side runs the library's own
JoinAgreement methods; the joiner's side is `await_admission` in a thread."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist

import topologies
from gossip_powersgd.errors import CommunicationError
from gossip_powersgd.membership.epochs import Membership
from gossip_powersgd.membership.joins import JoinAgreement, await_admission

#: Seconds any wait here may take on a loaded machine (each wait ends at once when it works).
WITHIN = 60.0
REMOVED = [(5, [0, 1, 3])]  # peer 2 of ring:4 was lost; the survivors went on from step 5


class Side(JoinAgreement):
    """One side of the store: a member (0) or the joiner (2), with what JoinAgreement reads."""

    def __init__(self, store, rank: int, digest: str, epochs, timeout: float = WITHIN):
        self.store, self.timeout, self.changes = store, timeout, []
        membership = Membership(topologies.parse("ring:4"), epochs)
        self.peer = SimpleNamespace(rank=rank, membership=membership)
        self.monitor = SimpleNamespace(resting=True, losses=[])
        self._init_joins()
        self.config_digest = digest

    @property
    def rank(self) -> int:
        return self.peer.rank

    def _store(self, operation, *args):
        return getattr(self.store, operation)(*args)

    def _lost(self):
        return []


@pytest.fixture
def store():
    """A fresh store holding the agreed epoch that removed peer 2."""
    s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    s.set("membership/1", json.dumps({"live": [0, 1, 3], "lost": {"2": "killed"}, "by": 0}))
    s.set("membership/1/step", json.dumps({"step": 5, "live": [0, 1, 3]}))
    return s


def joiner_in_thread(store, digest="A", timeout=WITHIN):
    """Start peer 2's `await_admission`; (thread, {"error" or "step": ...})."""
    outcome = {}
    side = Side(store, 2, digest, [], timeout)

    def body():
        try:
            outcome["step"] = await_admission(side, b"\0" * 8)
        except CommunicationError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def wait_for_request(store) -> None:
    deadline = time.monotonic() + WITHIN
    while not store.check(["membership/join/2"]):
        assert time.monotonic() < deadline, "the joiner posted no request"
        time.sleep(0.01)


def one_line(thread, outcome) -> str:
    thread.join(WITHIN)
    assert not thread.is_alive() and "error" in outcome, outcome
    assert "\n" not in outcome["error"]
    return outcome["error"]


def test_a_joiner_with_another_config_is_refused_and_the_members_go_on(store):
    thread, outcome = joiner_in_thread(store, digest="B")
    wait_for_request(store)
    member = Side(store, 0, "A", REMOVED)
    member._look_for_joiners(6)
    assert one_line(thread, outcome) == (
        "rank 2: --rejoin: the members refused peer 2: its config differs from the running "
        "members' (rejoin with the run's own config)"
    )
    # nothing was proposed: the members' membership is unchanged and no join is pending
    assert member._join is None and member.peer.membership.last.live == (0, 1, 3)
    assert not store.check(["membership/2"]) and not store.check(["membership/join/2"])


def test_a_join_agreed_at_the_runs_end_is_refused(store):
    thread, outcome = joiner_in_thread(store)
    wait_for_request(store)
    member = Side(store, 0, "A", REMOVED)
    member.steps = 10  # the run's last step is 9
    member._look_for_joiners(9)
    assert member._join is not None  # proposed as epoch 2, posted: it has not started step 9
    for k in (1, 3):  # the other members post the first step they have not started
        store.set(f"membership/2/at/{k}", json.dumps({"step": 10}))
    member._admit(9)
    assert one_line(thread, outcome) == (
        "rank 2: --rejoin: the members refused peer 2: the run ends at step 10, before its "
        "admission"
    )
    assert member.peer.membership.last.live == (0, 1, 3) and member.changes == []


def test_a_run_that_has_ended_is_refused_at_once(store):
    store.set("membership/over", "1")
    thread, outcome = joiner_in_thread(store)
    assert one_line(thread, outcome) == "rank 2: --rejoin: the run has ended; nothing to rejoin"
    assert not store.check(["membership/join/2"])  # no request left behind


def test_a_run_that_ends_while_the_joiner_waits_is_refused(store):
    thread, outcome = joiner_in_thread(store)
    wait_for_request(store)
    store.set("membership/over", "1")
    assert one_line(thread, outcome) == (
        "rank 2: --rejoin: the run ended before the members admitted peer 2"
    )


def test_a_peer_the_others_have_not_removed_cannot_rejoin():
    fresh = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    thread, outcome = joiner_in_thread(fresh, timeout=0.3)  # its peers have not found it lost
    error = one_line(thread, outcome)
    assert error.startswith("rank 2: --rejoin 2: peer 2 is still a member of the run (epoch 0")
    assert "only a peer the others removed can rejoin" in error and "waited 0.3 s" in error
