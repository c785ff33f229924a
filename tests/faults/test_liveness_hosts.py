"""Faults across hosts: a host's link cut, its ranks killed, its processes stopped, mid-run.

Three hosts of the emulated cluster (`python -m gossip_powersgd.cluster`, prefix `lv...`), one rank
each, ring:3, launched as the README's "Running across machines" does: torchrun on every host (c10d
rendezvous on host0), or mpiexec on host0 with a hostfile and gossip-cluster-ssh. The /proc check
cannot see another host; what finds these faults is the heartbeats of the liveness monitor, the
probe that tells a host that answers from one that does not, and a failed wait's diagnosis
(`gossip_powersgd.faults`). Before, every such fault left the other ranks to the 120 s comm
timeout, and a cut link or stopped host was named by nobody. Each test checks that every rank that
can still run ends within the design's bound (`host_fault_bound`, <= 30 s) and that the ranks
whose output reaches a terminal name host 1.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from host_faults import LOST, N, host_fault_bound, label, names_the_host, run_fault

from gossip_powersgd.cluster import network
from gossip_powersgd.faults import monitor

_names = itertools.count()

pytestmark = [
    pytest.mark.timing,
    pytest.mark.skipif(
        bool(network.missing_privileges()),
        reason="making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)",
    ),
]


def test_the_design_ends_a_host_fault_within_30_seconds():
    assert host_fault_bound() <= 30


@pytest.fixture
def prefix():
    """A cluster of N hosts of its own, removed afterwards, whatever happened."""
    name = f"lv{os.getpid() % 10**6}{next(_names)}"
    network.up(name, N, None, {})
    try:
        yield name
    finally:
        network.down(name)
        assert network.owned(name) == []


def _report(launcher: str, fault: str, result) -> str:
    return (
        f"{launcher} host {fault}: named after {result['named_after']} s, every rank gone after "
        f"{result['seconds']} s\n" + "\n".join(result["errors"])
    )


@pytest.mark.mpi
@pytest.mark.torchrun
@pytest.mark.parametrize("launcher", ["mpi", "torch"])
@pytest.mark.parametrize("fault", ["cut", "kill", "stop"])
def test_a_fault_on_another_host_is_named_by_every_rank_within_30_s(
    prefix, launcher, fault, tmp_path
):
    """Host 1 loses its link (`ip link set eth0 down`), has its rank's process SIGKILLed, or has
    every process SIGSTOPped, mid-run (tests/support/host_faults.py). Under mpiexec a killed rank
    is named by its supervisor (rank, pid, host, signal), and MPICH ends the others at once."""
    result = run_fault(prefix, launcher, fault, Path(tmp_path))
    errors, seconds, pids = result["errors"], result["seconds"], result["pids"]
    print(_report(launcher, fault, result))
    assert seconds is not None and seconds <= host_fault_bound(), errors
    # The ranks whose lines reach a terminal: under mpiexec, the cut host's go through the cable
    # that was cut; a killed rank is named by its supervisor, and MPICH then kills the others
    # within a fraction of a second, often before they speak. torchrun's agents write locally.
    speaking = [k for k in range(N) if k != LOST and (launcher, fault) != ("mpi", "kill")]
    for rank in speaking:
        assert names_the_host(errors, rank, fault), errors
    if fault == "cut" and launcher == "torch":  # the cut-off host names itself
        named = [e for e in errors if e.startswith(f"error (rank {LOST}): ")]
        assert named and f"this host, {label(LOST)}" in named[0]
    if fault == "kill" and launcher == "mpi":
        assert any(
            e.startswith(f"error (rank {LOST}): this rank's process (pid {pids[LOST]}")
            and f"host host{LOST}) was killed by signal 9 SIGKILL" in e
            for e in errors
        ), errors


@pytest.mark.torchrun
def test_every_process_of_a_host_killed_under_torchrun_is_named_at_once(prefix, tmp_path):
    """Host 1's agent and rank SIGKILLed together: the others' next exchange fails on the closed
    connection, and the diagnosis (a probe to its port is refused: the host answers, nothing
    listens) names it at once, before any heartbeat is missed."""
    result = run_fault(prefix, "torch", "kill-all", Path(tmp_path))
    errors, seconds = result["errors"], result["seconds"]
    print(_report("torch", "kill-all", result))
    assert seconds is not None and seconds < monitor.SILENT_SECONDS, errors
    for rank in (0, 2):
        assert any(
            e.startswith(f"error (rank {rank}): peer {LOST} on host {label(LOST)}")
            and "is gone" in e
            for e in errors
        ), errors
