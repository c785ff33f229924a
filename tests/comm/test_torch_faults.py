"""comm/torch_faults.py: why a torch.distributed peer left, told through the rendezvous store (on
real torchrun jobs: tests/faults/test_monitor.py, tests/faults/test_liveness.py)."""

import pytest

from gossip_powersgd.comm import torch_faults
from gossip_powersgd.comm.torch_faults import PeerWatch, undelivered


class Store:
    """The rendezvous store's set/get/check/add, in one process."""

    def __init__(self, **entries):
        self.data = {k.replace("__", "/"): v for k, v in entries.items()}

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        value = self.data[key]
        return value if isinstance(value, bytes) else str(value).encode()

    def check(self, keys):
        return all(k in self.data for k in keys)

    def add(self, key, amount):
        self.data[key] = int(self.data.get(key, 0)) + amount
        return self.data[key]


class Gone(Store):
    """A store whose host has ended: every call fails."""

    def __getattribute__(self, name):
        if name in ("set", "get", "check", "add"):
            raise RuntimeError("connection reset")
        return super().__getattribute__(name)


def test_the_first_cause_wins_and_a_leaving_peer_counts_once():
    store = Store()
    watch = PeerWatch(store, 1, 4, None)
    watch.tell_exit()
    watch.record("peer 3 was cut off", leaving=3)
    watch.record("", leaving=1)  # told again: counted once
    assert store.get("cause").decode().startswith("peer 1 ended its process (sys.exit")
    assert store.data["failed"] == 2 and store.data["left/1"] == 2
    error = PeerWatch(store, 2, 4, None).failure("no message from neighbour 1 (after 30 s)", [1])
    assert str(error) == (
        "rank 2: peer 1 ended its process (sys.exit, or the end of its script) before the others "
        "were done (no message from neighbour 1)"
    )


def test_without_a_cause_or_a_monitor_the_wait_itself_is_named():
    assert str(PeerWatch(Store(), 0, 2, None).failure("no message from neighbour 1", [1])) == (
        "rank 0: no message from neighbour 1"
    )


def test_a_store_that_ended_with_its_host_is_no_new_error():
    watch = PeerWatch(Gone(), 0, 2, None)
    watch.tell_exit()  # nothing raised
    assert str(watch.failure("waited", [1])) == "rank 0: waited"


def test_a_timeout_names_the_peers_at_the_end_of_the_chain_of_waits(monkeypatch):
    """Rank 0 waited for 1, which waited for 2 and 3; 3 waited for 2; 2 waits for nobody: 2 is the
    one that sent nothing. Where the peers waited for are the roots, the plain error stands."""
    monkeypatch.setattr(torch_faults, "TELL_SECONDS", 0.0)
    store = Store(waiting__1="2,3", waiting__3="2")
    error = PeerWatch(store, 0, 4, None).timed_out("no message from neighbour 1 (after 5 s)", [1])
    assert str(error) == (
        "rank 0: no message from neighbour 1: they wait for peer(s) [2] themselves, which sent "
        "nothing (is it alive?)"
    )
    assert store.get("waiting/0") == b"1"  # what rank 0 tells the others
    plain = PeerWatch(Store(), 0, 4, None).timed_out("no message from neighbour 2", [2])
    assert str(plain) == "rank 0: no message from neighbour 2"


def test_undelivered_names_the_senders_whose_receive_is_not_complete():
    class Work:
        def __init__(self, outcome):
            self.outcome = outcome

        def wait(self, timeout):
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

    receives = [(Work(True), 1), (Work(False), 2), (Work(RuntimeError("closed")), 3)]
    assert undelivered(receives) == [2, 3]


@pytest.mark.parametrize("entry", ["", None])
def test_an_empty_or_absent_wait_entry_is_waiting_for_nobody(monkeypatch, entry):
    monkeypatch.setattr(torch_faults, "TELL_SECONDS", 0.0)
    store = Store() if entry is None else Store(waiting__1=entry)
    error = PeerWatch(store, 0, 2, None).timed_out("no message from neighbour 1", [1])
    assert str(error) == "rank 0: no message from neighbour 1"
