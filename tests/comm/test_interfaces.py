"""comm/interfaces.py: which interface gloo binds to, from the route to the rendezvous host (across
emulated hosts: tests/cluster/test_network.py)."""

import os

from gossip_powersgd.comm import interfaces
from gossip_powersgd.comm.interfaces import bind_gloo_to_route, interface_towards, source_address


class FakeStore(dict):
    """The rendezvous store's set/get/wait, in one process."""

    def set(self, key, value):
        self[key] = value.encode()

    def get(self, key):
        return self[key]

    def wait(self, keys, timeout):
        assert all(k in self for k in keys)


def test_gloo_is_bound_to_the_interface_towards_the_master(monkeypatch):
    from gossip_powersgd.comm import interfaces

    assert interface_towards("127.0.0.1") == "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine")
    assert bind_gloo_to_route(FakeStore(), 0, 1, "127.0.0.1", 1) == "mine"  # the user's stands
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert bind_gloo_to_route(FakeStore(), 0, 1, "127.0.0.1", 1) == "lo"  # all on this host
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    # the master's name is loopback here but rank 1 reaches it from 192.168.77.2: gloo must
    # listen where rank 1 can connect, on the interface towards it
    monkeypatch.setattr(interfaces, "interface_towards", lambda target: f"towards {target}")
    store = FakeStore({"gloo_address/1": b"192.168.77.2"})
    assert bind_gloo_to_route(store, 0, 2, "127.0.0.1", 1) == "towards 192.168.77.2"
    assert store["gloo_address/0"] == b"127.0.0.1"


def test_an_unresolvable_host_has_no_source_address_nor_interface():
    name = "no-such-host.invalid"  # RFC 6761: never resolves
    assert source_address(name) is None and interface_towards(name) is None
    assert source_address("127.0.0.1") == "127.0.0.1"


def test_a_rank_that_never_publishes_leaves_the_master_as_the_target(monkeypatch):
    """On the master's host (its name loopback there) with rank 1 gone before it published: the
    wait fails, and gloo binds towards the master itself, whose group checks name the lost rank."""

    class Gone(FakeStore):
        def wait(self, keys, timeout):
            raise RuntimeError("timed out")

    # bind_gloo_to_route writes GLOO_SOCKET_IFNAME itself; monkeypatch undoes only what it
    # recorded, so record the variable first (a leftover value is inherited by every later
    # test's torchrun and gloo cannot bind: every torch test after this one fails)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "recorded")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setattr(interfaces, "interface_towards", lambda target: f"towards {target}")
    assert bind_gloo_to_route(Gone(), 0, 2, "127.0.0.1", 0.1) == "towards 127.0.0.1"
    # a later group chooses again: this process's own earlier choice is no user's setting
    assert os.environ["GLOO_SOCKET_IFNAME"] == "towards 127.0.0.1"
    store = FakeStore({"gloo_address/1": b"10.0.0.2"})
    assert bind_gloo_to_route(store, 0, 2, "127.0.0.1", 1) == "towards 10.0.0.2"
