"""Peer liveness and the policy for a lost peer, for the process transports (MPI, torch.distributed).

`monitor` holds the detection and the policy (read it first); `liveness` the signals it reads
(process states, heartbeats, probes); `supervisor` the thin parent that names a rank MPICH's
fail-stop would otherwise take down without a word. Standard library only, so that it runs before
torch and MPI are imported: the transports and the training programs call in here.

    start()                 the process's monitor (idempotent), or None outside a launched run
    current()               the monitor, if started
    handled()               a lost peer was already reported: an error now is its consequence
    ended_by_loss()         as the main thread ends: whether a recorded loss ends the job
    finish(code)            let the monitor end this process, as the policy decides
    on_import()             the training programs' hook, first thing at package import
    stopped_seconds()       the run's stop threshold (GOSSIP_STOPPED_SECONDS, or 15 s)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

from . import liveness, supervisor
from .monitor import (
    ANNOUNCE_BYTES,
    CHECK_SECONDS,
    GAP_SECONDS,
    PROBE_SECONDS,
    SILENT_SECONDS,
    SPEAK_SECONDS,
    STOPPED_SECONDS,
    Monitor,
    PeerLost,
    on_peer_loss,
)

_monitor: Optional[Monitor] = None
#: The environment variable that sets a run's stop threshold (every rank reads it as it starts).
STOPPED_VAR = "GOSSIP_STOPPED_SECONDS"


def stopped_seconds() -> float:
    """How long a peer seen stopped is waited for: STOPPED_VAR's value where it is set, else
    STOPPED_SECONDS. A value that is not a number of seconds from GAP_SECONDS to 3600 is refused
    (ValueError, one line): shorter, a rank's own pause of GAP_SECONDS would not be told apart."""
    text = os.environ.get(STOPPED_VAR)
    if text is None:
        return STOPPED_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not GAP_SECONDS <= value <= 3600:
        raise ValueError(
            f"{STOPPED_VAR}={text!r} is not a number of seconds from {GAP_SECONDS:g} to 3600: set "
            f"it to one (e.g. {STOPPED_SECONDS:g}, the default) or unset it"
        )
    return value


def start(rank: Optional[int] = None, size: Optional[int] = None) -> Optional[Monitor]:
    """This process's monitor, started now if it was not (rank and size from the launcher's
    environment unless given); None for a run of one process or outside a launcher."""
    global _monitor
    if _monitor is None:
        if rank is None or size is None:
            launched = liveness.launched_rank()
            if launched is None:
                return None
            rank, size = launched
        if size <= 1:
            return None
        _monitor = Monitor(rank, size, stopped_seconds())
    return _monitor


def current() -> Optional[Monitor]:
    return _monitor


def handled() -> bool:
    """True once this process has reported a lost peer (and is being ended because of it)."""
    return _monitor is not None and _monitor.event is not None


def ended_by_loss() -> bool:
    """For a main thread that finished without an error: True if this rank recorded a loss that
    ends the job (it said "ending the job", so its exit status must not be 0: `finish`); else it
    leaves at once (`Monitor.leave`, under the monitor's lock), so that no loss is recorded after
    this answer. Before, a loss recorded as the main thread finished ended the rank with 0."""
    if _monitor is None:
        return False
    _monitor.leave()
    return _monitor.event is not None


def finish(code: int) -> None:
    """Wait for the monitor to end this process (after the other ranks have spoken), then, if it
    somehow has not, end it with `code`."""
    deadline = time.monotonic() + SPEAK_SECONDS + 2 * CHECK_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: How long a rank that fails before its transport is set up waits for the others to print theirs;
#: the transports' own wait at a failing exit (`comm.mpi_world.GRACE_SECONDS`) is this one.
EXIT_GRACE_SECONDS = 5.0


def agent_store(seconds: float):
    """(torchrun's own store, WORLD_SIZE), for a rank that fails before it has a communicator
    (backend local under torchrun, a bad setting): torchrun ends the other workers at the first
    one's exit, and one still importing would never print its line. None outside torchrun, or
    when the store is not reached within `seconds`."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import datetime

    import torch.distributed as dist

    try:
        world_size = int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=seconds),
        )
    except (KeyError, ValueError, RuntimeError):  # RuntimeError: DistNetworkError, DistStoreError
        return None
    return dist.PrefixStore("gossip_powersgd/exit/", store), world_size


def wait_for_failed_peers(store, world_size: int, seconds: float) -> bool:
    """Count this rank as failed in `store` and wait until all `world_size` ranks have (each has
    printed its line), `seconds` at most. True if they all have (False: not, or no store)."""
    try:
        count = store.add("failed", 1)
        deadline = time.monotonic() + seconds
        while count < world_size and time.monotonic() < deadline:
            time.sleep(0.02)
            count = store.add("failed", 0)
        return count >= world_size
    except Exception:  # noqa: BLE001 - the store may be gone with its host; exit regardless
        return False


def fail() -> None:
    """This rank ends with an error while others go on (on_peer_loss: continue): tell them it is
    lost ("failed") in place of the clean goodbye its exit would give (`Monitor.leave`), so that
    they go on without it at once rather than wait out comm_timeout for a peer that said it left
    cleanly. Under abort, or after a loss that ends the job, nothing (its end is told already);
    nor from a resting monitor (a --rejoin process not admitted is no member: named lost, its id
    would be the live member's)."""
    m = _monitor
    if m is None or m.policy != "continue" or m.resting:
        return
    with m._lock:
        if m.closed or m.event is not None:
            return
        m.event = PeerLost(m.rank, "failed", m.host)
        m.closed = True  # no look, no loss and no goodbye after this
    m._beat()


def on_import() -> None:
    """Run first when the package is imported: under mpiexec, the training programs become their
    rank's supervisor (`supervisor`); in a launched training program, the monitor starts at once,
    before torch is imported, so that a peer stopped during set-up is found."""
    if supervisor.main_program() not in supervisor.PROGRAMS:
        return
    try:
        stopped_seconds()  # a bad setting ends every rank at once, before any set-up
    except ValueError as exc:
        launched = liveness.launched_rank()
        prefix = f"error (rank {launched[0]}): " if launched and launched[1] > 1 else "error: "
        sys.stderr.write(f"{prefix}{exc}\n")
        sys.stderr.flush()
        if launched and launched[1] > 1:  # under torchrun, once every rank has printed its line
            store_and_size = agent_store(EXIT_GRACE_SECONDS)
            if store_and_size is not None:
                wait_for_failed_peers(*store_and_size, EXIT_GRACE_SECONDS)
        sys.exit(2)
    if liveness.SUPERVISOR_VAR in os.environ:
        supervisor.bind_to_supervisor()
    elif supervisor.under_mpi_launcher() and (liveness.launched_rank() or (0, 1))[1] > 1:
        supervisor.supervise()
    start()


__all__ = [
    "ANNOUNCE_BYTES",
    "CHECK_SECONDS",
    "PROBE_SECONDS",
    "SILENT_SECONDS",
    "SPEAK_SECONDS",
    "STOPPED_SECONDS",
    "STOPPED_VAR",
    "agent_store",
    "wait_for_failed_peers",
    "Monitor",
    "PeerLost",
    "current",
    "ended_by_loss",
    "finish",
    "handled",
    "on_import",
    "on_peer_loss",
    "start",
    "stopped_seconds",
]
