"""comm/torch_rejoin.py: a process rejoining a running run (`gossip-train --rejoin ID`) before the
members admit it: alone, and checked against the run's set-up (whole rejoins under torchrun:
tests/comm/test_torch_members.py)."""

import pytest
import torch

import topologies
from gossip_powersgd.comm.base import CommunicationError, digest
from gossip_powersgd.comm.torch_rejoin import (
    RejoiningCommunicator,
    SoloGroup,
    rejoin_as,
    rejoining,
)


def test_rejoin_as_names_the_peer_of_the_next_communicator():
    assert rejoining() is None
    try:
        rejoin_as(3)
        assert rejoining() == 3
    finally:
        rejoin_as(None)
    assert rejoining() is None


def test_alone_before_its_admission_it_gathers_itself_and_talks_to_nobody():
    group = SoloGroup(4)
    assert group.live == (4,) and group.allgather_bytes(b"x", None, None) == [b"x"]
    for operation in (group.send, group.recv):
        with pytest.raises(
            CommunicationError,
            match=r"^rank 4: a rejoining peer talks to peer 1 before the members admitted it",
        ):
            operation(torch.zeros(1), 1)


class Store:
    def __init__(self, entries):
        self.entries = entries

    def check(self, keys):
        return all(k in self.entries for k in keys)

    def get(self, key):
        return self.entries[key].encode()


class Monitor:
    def __init__(self):
        self.joined, self.resting = None, False

    def announce(self):
        return b"mine"

    def join(self, announcements, timeout):
        self.joined = announcements


def stub(entries, monitor=None):
    """The state `_agree_before_joining` reads: this process is rank 1 of 3."""

    class Stub:
        _store, rank, _monitor, timeout = Store(entries), 1, monitor, 5.0

    return Stub()


TOPOLOGY = topologies.ring(3)
RUN = digest(f"{TOPOLOGY.size}:{TOPOLOGY.fingerprint}").hex()


def test_without_a_running_run_it_says_to_start_the_run_first(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "host0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(
        CommunicationError,
        match=r"^rank 1: --rejoin found no running run at host0:29500 \(the store holds no "
        r"set-up\): start the run first$",
    ):
        RejoiningCommunicator._agree_before_joining(stub({}), TOPOLOGY, 3, torch.device("cpu"))


@pytest.mark.parametrize("hello", [f"{'0' * 64}|cpu|aa", f"{RUN}|cuda|aa"])
def test_another_topology_or_device_than_the_runs_is_refused(hello):
    with pytest.raises(CommunicationError, match="topology or device differs .*run's own config"):
        RejoiningCommunicator._agree_before_joining(
            stub({"hello/0": hello}), TOPOLOGY, 3, torch.device("cpu")
        )


def test_its_monitor_takes_the_runs_announcements_with_its_own_and_rests():
    monitor = Monitor()
    entries = {"hello/0": f"{RUN}|cpu|0a", "hello/1": f"{RUN}|cpu|0b", "hello/2": f"{RUN}|cpu|0c"}
    process = stub(entries, monitor)
    RejoiningCommunicator._agree_before_joining(process, TOPOLOGY, 3, torch.device("cpu"))
    assert monitor.joined == [b"\x0a", b"mine", b"\x0c"] and monitor.resting
    assert process._owns_group is False
