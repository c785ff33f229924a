"""Every transport satisfies the `Comm` protocol (comm/protocol.py): the names it lists, with the same
parameters, on each transport class, and the data attributes on a live communicator."""

from __future__ import annotations

import inspect

import pytest

import topologies
from gossip_powersgd import LocalCluster, MPICommunicator, TorchCommunicator
from gossip_powersgd.comm.base import Communicator
from gossip_powersgd.comm.protocol import Comm
from gossip_powersgd.comm.local import LocalCommunicator
from gossip_powersgd.privacy.views import RecordingCommunicator

DATA = ("rank", "size", "topology", "neighbors", "timeout", "stats")


def _members():
    """The protocol's methods and properties (its data attributes are `DATA`)."""
    return {
        name: value
        for name, value in vars(Comm).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def test_the_protocol_lists_what_the_transports_share():
    assert set(_members()) == {
        "is_static",
        "is_directed",
        "topology_at",
        "neighbors_at",
        "out_neighbors_at",
        "in_neighbors_at",
        "exchange",
        "exchange_directed",
        "allreduce_",
        "allgather_bytes",
        "barrier",
        "check_agreement",
    }
    assert set(Comm.__annotations__) == set(DATA)


@pytest.mark.parametrize(
    "transport", [LocalCommunicator, MPICommunicator, TorchCommunicator, Communicator]
)
def test_every_transport_class_has_the_protocols_methods(transport):
    for name, wanted in _members().items():
        have = inspect.getattr_static(transport, name)
        if isinstance(wanted, property):
            assert isinstance(have, property), (transport, name)
            continue
        params = list(inspect.signature(wanted).parameters)
        assert list(inspect.signature(getattr(transport, name)).parameters) == params, (
            transport.__name__,
            name,
        )


def test_a_live_communicator_and_a_wrapper_satisfy_the_protocol():
    def peer(comm):
        wrapped = RecordingCommunicator(comm, lambda send, recv: None)
        return (
            isinstance(comm, Comm),
            isinstance(wrapped, Comm),
            [type(getattr(comm, name)).__name__ for name in DATA],
        )

    results = LocalCluster(topologies.parse("ring:3")).run(peer)
    for is_comm, wrapper_is_comm, types in results:
        assert is_comm and wrapper_is_comm
        assert types == ["int", "int", "Topology", "tuple", "float", "CommStats"]
    for name in ("exchange", "exchange_directed"):  # the wrapper's own, not delegated
        assert list(inspect.signature(getattr(RecordingCommunicator, name)).parameters) == list(
            inspect.signature(getattr(Comm, name)).parameters
        )
