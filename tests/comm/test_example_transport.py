"""A new transport is one file plus one registry line: this file is the file,
`register_transport(SerialThreads)` (in the fixture, so that the registry other tests see stays as
shipped) the line. The class describes itself; a config names it, validation accepts it, `run`
trains with it and `--help-config` lists it, with nothing else in the package told about it."""

from __future__ import annotations

import threading

import pytest
import topologies
import torch

from gossip_powersgd import run
from gossip_powersgd.comm.transports import TRANSPORTS, Transport, register_transport
from gossip_powersgd import launch
from gossip_powersgd.launch import resolve_backend, run_peers
from gossip_powersgd.training.config import config_from_dict, validate_config

TINY = dict(
    topology="ring:4",
    algorithm="powergossip:rank=1",
    dataset="synthetic_logreg:d=20,classes=4,n=2000",
    partition="iid",
    model="logreg",
    lr=0.5,
    epochs=1,
    eval_every=1,
    log_every=5,
    seed=0,
    quiet=True,
)


class SerialThreads(Transport):
    """Every peer a thread of this process, as backend local, but over a cluster it builds itself
    and with the peers' threads named after the transport (what a tracing transport would do)."""

    name = "serialthreads"
    summary = "every peer a named thread of this process (the example transport)"
    in_process = True
    runs = 0

    def run_peers(self, topology, fn, args, kwargs, timeout, device):
        from gossip_powersgd.comm.local import LocalCluster

        type(self).runs += 1

        def named(comm, *a, **k):
            threading.current_thread().name = f"{self.name}-{comm.rank}"
            return fn(comm, *a, **k)

        values = LocalCluster(topology, timeout=timeout).run(named, *args, **kwargs)
        return dict(enumerate(values))


@pytest.fixture
def registered():
    register_transport(SerialThreads)
    SerialThreads.runs = 0
    yield TRANSPORTS.get("serialthreads")
    TRANSPORTS.unregister("serialthreads")


def test_a_config_naming_it_trains_the_same_models_as_backend_local(registered):
    local = run(dict(TINY, backend="local"), states=True)
    mine = run(dict(TINY, backend="serialthreads"), states=True)
    assert SerialThreads.runs == 1 and mine.config.backend == "serialthreads"
    # The transport moves the same bytes in the same order: every peer's final model is local's,
    # bit for bit (the repository's promise that transports give the same models for one seed).
    assert sorted(mine.states) == [0, 1, 2, 3]
    for rank, state in local.states.items():
        assert all(torch.equal(state[k], mine.states[rank][k]) for k in state)
    assert mine.bytes_sent == local.bytes_sent


def test_validation_auto_detection_and_help_know_it_only_while_registered(registered):
    config = config_from_dict(dict(TINY, backend="serialthreads"))
    validate_config(config)
    assert (
        resolve_backend("serialthreads") == "serialthreads" and "serialthreads" in launch.BACKENDS
    )
    assert resolve_backend(None) == "local"  # it never claims a process (detect() is False)
    names = run_peers(
        topologies.parse("ring:3"),
        lambda comm: threading.current_thread().name,
        backend="serialthreads",
    )
    assert names == {r: f"serialthreads-{r}" for r in range(3)}
    from gossip_powersgd.cli.help import describe_registries

    assert "  serialthreads  every peer a named thread" in describe_registries()
    TRANSPORTS.unregister("serialthreads")
    with pytest.raises(
        ValueError, match=r"unknown backend 'serialthreads'; valid: mpi, local, torch"
    ):
        resolve_backend("serialthreads")
    with pytest.raises(ValueError, match=r"'backend'.*valid: mpi, local, torch"):
        validate_config(config)


def test_an_incomplete_transport_is_refused_naming_what_it_lacks():
    class Launched(Transport):
        name = "launched"
        summary = "a launched transport without its launcher"
        in_process = False

    with pytest.raises(TypeError, match=r"does not declare `launcher`"):
        register_transport(Launched)

    class Clash(SerialThreads):
        name = "local"

    with pytest.raises(TypeError, match=r"transport name 'local' is taken by LocalTransport"):
        register_transport(Clash)
    assert TRANSPORTS.names() == ("mpi", "local", "torch")
