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
import signal
import sys
import time
from pathlib import Path

import pytest

from gossip_powersgd.cluster import network
from gossip_powersgd.cluster.enter import enter_command
from gossip_powersgd.faults import monitor
from liveness_jobs import LONG_RUN, TINY, Job, clean_env, last_gone, rank_pids

N = 3
LOST = 1
#: Seconds a launcher takes to end what is left once a rank ended, with room for load.
LAUNCHER_SECONDS = 5.0
BIN = Path(sys.executable).parent
_names = itertools.count()

pytestmark = [
    pytest.mark.timing,
    pytest.mark.skipif(
        bool(network.missing_privileges()),
        reason="making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)",
    ),
]


def host_fault_bound() -> float:
    """When every rank still able to run must be gone after a fault on another host: silent for
    `SILENT_SECONDS` (from a heartbeat up to a look late), probed for up to `PROBE_SECONDS`, then
    `SPEAK_SECONDS` for the others to say it and a look, a look's time for the launcher to pass
    the lines on (`Monitor._end`), then the launcher."""
    m = monitor
    return (
        m.SILENT_SECONDS
        + 2 * m.CHECK_SECONDS
        + m.PROBE_SECONDS
        + m.SPEAK_SECONDS
        + 2 * m.CHECK_SECONDS
        + LAUNCHER_SECONDS
    )


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


def _label(k: int) -> str:
    return f"host{k} ({network.address(k)})"


def _launch(prefix: str, launcher: str, work: Path):
    """The jobs of a ring:3 run, one rank per host (torchrun: one job per host)."""
    backend = "mpi" if launcher == "mpi" else "torch"
    sets = [f"backend={backend}", f"topology=ring:{N}", f"out_dir={work / 'run'}", *LONG_RUN]
    program = ["-m", "gossip_powersgd.cli.train", "--config", str(TINY)]
    program += [arg for s in sets for arg in ("--set", s)]
    env = clean_env({network.PREFIX_ENV: prefix})
    if launcher == "mpi":
        hostfile = work / "hosts.txt"
        hostfile.write_text("".join(f"host{k}\n" for k in range(N)))
        argv = [str(BIN / "mpiexec"), "-f", str(hostfile), "-n", str(N), "-launcher", "ssh"]
        argv += ["-launcher-exec", str(BIN / "gossip-cluster-ssh"), sys.executable, *program]
        return [Job(enter_command(prefix, "host0", argv), env=env)]
    torchrun = [str(BIN / "torchrun"), "--nnodes", str(N), "--nproc-per-node", "1"]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "host0:29400"]
    return [
        Job(enter_command(prefix, f"host{k}", [*torchrun, *program]), env=env) for k in range(N)
    ]


def _errors(jobs):
    return [e for job in jobs for e in job.errors()]


@pytest.mark.mpi
@pytest.mark.torchrun
@pytest.mark.parametrize("launcher", ["mpi", "torch"])
@pytest.mark.parametrize("fault", ["cut", "kill", "stop"])
def test_a_fault_on_another_host_is_named_by_every_rank_within_30_s(
    prefix, launcher, fault, tmp_path
):
    """Host 1 loses its link (`ip link set eth0 down`), has its rank's process SIGKILLed, or has
    every process SIGSTOPped, mid-run. Under mpiexec a killed rank is named by its supervisor
    (rank, pid, host, signal), and MPICH ends the others at once."""
    jobs = _launch(prefix, launcher, tmp_path)
    try:
        jobs[0].wait_line(r"^epoch 1/", 300)
        pids = {}
        for job in jobs:
            pids.update(rank_pids(job.process.pid))
        assert sorted(pids) == list(range(N)), pids
        faulted = time.monotonic()
        if fault == "cut":  # `ip link set eth0 down` on the host
            network.set_link(prefix, f"host{LOST}", False, at="host")
        elif fault == "kill":
            os.kill(pids[LOST], signal.SIGKILL)
        else:
            network.signal_host(prefix, f"host{LOST}", signal.SIGSTOP)
        running = [p for k, p in pids.items() if fault != "stop" or k != LOST]
        seconds = last_gone(running, faulted, 90)
    finally:
        for job in jobs:
            job.kill()
        network.signal_host(prefix, f"host{LOST}", signal.SIGKILL)
    errors = _errors(jobs)
    named = [t for t in (job.first_error_after(faulted) for job in jobs) if t is not None]
    print(
        f"{launcher} host {fault}: named after {min(named, default=None)} s, every rank gone "
        f"after {seconds} s\n" + "\n".join(errors)
    )
    assert seconds is not None and seconds <= host_fault_bound(), errors
    lost = f"host {_label(LOST)}"
    how = {
        "cut": "is unreachable: no heartbeat for",
        "kill": "is gone: its process ended without a word",
        "stop": "though its host answers: it is stopped or hung",
    }[fault]
    # The ranks whose lines reach a terminal: under mpiexec, the cut host's go through the cable
    # that was cut; a killed rank is named by its supervisor, and MPICH then kills the others
    # within a fraction of a second, often before they speak. torchrun's agents write locally.
    speaking = [k for k in range(N) if k != LOST and (launcher, fault) != ("mpi", "kill")]
    for rank in speaking:
        named = [e for e in errors if e.startswith(f"error (rank {rank}): ")]
        assert named and all(f"peer {LOST} on {lost} " in e and how in e for e in named), errors
    if fault == "cut" and launcher == "torch":  # the cut-off host names itself
        named = [e for e in errors if e.startswith(f"error (rank {LOST}): ")]
        assert named and f"this host, {_label(LOST)}" in named[0]
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
    jobs = _launch(prefix, "torch", tmp_path)
    try:
        jobs[0].wait_line(r"^epoch 1/", 300)
        pids = {}
        for job in jobs:
            pids.update(rank_pids(job.process.pid))
        faulted = time.monotonic()
        network.signal_host(prefix, f"host{LOST}", signal.SIGKILL)
        seconds = last_gone(list(pids.values()), faulted, 90)
    finally:
        for job in jobs:
            job.kill()
    errors = _errors(jobs)
    named = [t for t in (job.first_error_after(faulted) for job in jobs) if t is not None]
    print(
        f"torch host kill-all: named after {min(named, default=None)} s, every rank gone after "
        f"{seconds} s\n" + "\n".join(errors)
    )
    assert seconds is not None and seconds < monitor.SILENT_SECONDS, errors
    for rank in (0, 2):
        assert any(
            e.startswith(f"error (rank {rank}): peer {LOST} on host {_label(LOST)}")
            and "is gone" in e
            for e in errors
        ), errors
