"""The MPI transport: one peer per MPI rank, raw buffers on the wire (never pickle).

Point-to-point messages use mpi4py's upper-case buffer methods on zero-copy byte views of contiguous
CPU tensors (tensors on another device are staged through the CPU). Sends are non-blocking and all
posted before any receive; receives are matched with a probe so that a message of the wrong size or
dtype (the dtype travels in the tag) is reported naming the sender before it touches our buffer.
Every wait polls with a deadline, so a silent or dead neighbour becomes an error naming it rather
than a hang.

Creating an `MPICommunicator` installs `abort_on_uncaught_exception`: an exception that escapes on
one rank (a plain script, no `main_guard`) ends every rank within a few seconds, naming the rank
that failed, instead of leaving the others to wait out their timeouts.

A rank that leaves in any other way tells the others why, on a private duplicate communicator (three
numbers: what happened, to which peer, for how long): a process that ends while its communicator is
open (`sys.exit` in user code, the end of a script that never calls `close`) says so at exit, a rank
that gives up on a peer (a timeout, or a peer of its machine found stopped, see `liveness`) says
which peer, and a rank that was waiting for the one that left repeats the cause it read. So every
rank names the peer at the root of the failure, not the live neighbour it was waiting for.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from ..utils import one_line, write_stderr_line

import torch

from .base import (
    CODE_DTYPES,
    DTYPE_CODES,
    AgreementError,
    Communicator,
    CommunicationError,
    Tensor,
    as_topology,
    describe_disagreement,
    digest,
)
from .liveness import STOPPED_HOW, StopWatch, process_key, stopped_after, stopped_message

if TYPE_CHECKING:
    from mpi4py.MPI import Comm as MPIComm  # an mpi4py communicator, not the `Comm` protocol

    from topologies import Topology

_TAG_BASE = 1000
_NOTICE_TAG = 7
# On COMM_WORLD itself, for a rank that ends before it created any MPICommunicator (see
# `tell_world_at_exit`): no other communicator is shared yet.
_WORLD_EXIT_TAG = 32_123
# What a notice says happened to its culprit.
_EXITED, _STOPPED, _SILENT = 1.0, 2.0, 3.0
#: Seconds a rank still looks for a peer's message after reading that the peer exited: the notice
#: travels on another communicator than the message, so it may arrive first.
NOTICE_GRACE = 1.0

#: How long a failing rank waits for the other ranks to fail too before it aborts the whole job.
GRACE_SECONDS = 5.0


def exit_or_abort(code: int) -> None:
    """End this rank with `code`; if some rank is still running after GRACE_SECONDS, abort the job.

    Every failing rank enters a non-blocking barrier. When all ranks failed (a bad config found by a
    collective check), all reach it and exit with their own message; when only some did, the
    others are busy elsewhere, the barrier never completes, and MPI_Abort takes the job down so that
    nobody waits for a peer that is gone.
    """
    global _failing
    _failing = True  # the peers learn it from the abort or from their own failure, not a notice
    MPI = _mpi()
    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        request = MPI.COMM_WORLD.Ibarrier()
        deadline = time.monotonic() + GRACE_SECONDS
        while not request.Test():
            if time.monotonic() > deadline:
                sys.stderr.flush()
                MPI.COMM_WORLD.Abort(code)
            time.sleep(0.01)
    sys.stdout.flush()
    sys.exit(code)


_failing = False
_communicators = 0  # MPICommunicators created in this process (each then tells its own peers)
_world_hook = False


def tell_world_at_exit() -> None:
    """Make this process, if it ends before creating an MPICommunicator (`sys.exit` in code that
    runs first, such as a dataset module the config names), tell every other rank of COMM_WORLD,
    which waits for it in the communicator's set-up. Called by the training CLI once MPI is up."""
    global _world_hook
    if not _world_hook:
        _world_hook = True
        atexit.register(_tell_world_exit)


def _tell_world_exit() -> None:
    import numpy as np

    MPI = _mpi()
    if _communicators or _failing or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    notice = np.array([_EXITED, rank, 0.0], dtype=np.float64)
    requests = [
        world.Isend([notice, MPI.BYTE], dest=k, tag=_WORLD_EXIT_TAG)
        for k in range(size)
        if k != rank
    ]
    deadline = time.monotonic() + 1.0  # small messages leave at once; never hold up the exit
    while not MPI.Request.Testall(requests) and time.monotonic() < deadline:
        time.sleep(1e-3)


def _report_uncaught(exc_type, exc, tb) -> None:
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
        sys.__excepthook__(exc_type, exc, tb)
        return
    MPI = _mpi()
    rank = MPI.COMM_WORLD.Get_rank()
    traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
    write_stderr_line(f"error (rank {rank}): {one_line(exc)}")
    try:
        exit_or_abort(1)
    except SystemExit:
        pass  # the interpreter is already on its way out with a non-zero status


def abort_on_uncaught_exception() -> None:
    """Make an uncaught exception on any rank end the whole MPI job (see `exit_or_abort`).

    Installed as `sys.excepthook` by the first `MPICommunicator`; an excepthook the user set
    themselves is left alone.
    """
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _report_uncaught


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "MPICommunicator needs mpi4py: pip install 'gossip_powersgd[mpi]' (or build mpi4py "
            "against your system MPI: env MPICC=mpicc pip install --no-binary=mpi4py mpi4py)"
        ) from exc
    return MPI


def _byte_view(tensor: Tensor):
    """A numpy uint8 view sharing memory with a contiguous CPU tensor."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


class _Poller:
    """Sleep a little longer each time nothing happened: MPI ranks often oversubscribe the cores,
    and a busy wait would steal the CPU from the very peer we are waiting for."""

    def __init__(self, timeout: float):
        self.deadline = time.monotonic() + timeout
        self.delay = 0.0

    def idle(self) -> bool:
        """Wait a moment; False once the deadline has passed."""
        if time.monotonic() > self.deadline:
            return False
        time.sleep(self.delay)
        self.delay = min(1e-3, self.delay * 2 + 2e-5)
        return True

    def progressed(self) -> None:
        self.delay = 0.0


class MPICommunicator(Communicator):
    """One peer per MPI rank of `comm` (default `MPI.COMM_WORLD`), on `topology`.

    The constructor is collective: all ranks compare the topology's fingerprint and check that the
    world size equals the topology's size; either failure raises the same error on every rank.
    `timeout` (seconds) bounds every wait for a neighbour or a collective.
    """

    def __init__(
        self, topology: Topology, comm: MPIComm | None = None, timeout: float | None = None
    ):
        import numpy as np

        MPI = _mpi()
        self._MPI = MPI
        abort_on_uncaught_exception()
        topology = as_topology(topology, "MPICommunicator")
        global _communicators
        _communicators += 1
        self.timeout = 120.0 if timeout is None else float(timeout)
        # A private duplicate, so that our messages never match a user's receives.
        self._comm = self._first_dup(comm if comm is not None else MPI.COMM_WORLD)
        # The all-reduce ring talks on its own duplicate, so its messages never match an exchange's.
        self._ring_comm = self._comm.Dup()
        # Why a peer left (see the module docstring), never matched by any other receive.
        self._notice_comm = self._comm.Dup()
        self._notices: Dict[int, tuple] = {}  # sender -> ((kind, culprit, seconds), time read)
        self._outbox: list = []  # notices in flight, kept alive until the process ends
        self._closed = self._told = False
        world_rank, world_size = self._comm.Get_rank(), self._comm.Get_size()
        self.rank = world_rank  # needed by the raw all-gather below before the base class is set up
        self._watch = StopWatch({}, stopped_after(self.timeout))
        key = process_key()
        infos = self._allgather_raw(np.array([os.getpid()], dtype=np.int64).tobytes() + key)
        self._watch = StopWatch(
            {
                k: int(np.frombuffer(info[:8], dtype=np.int64)[0])
                for k, info in enumerate(infos)
                if info[8:] == key and key != bytes(8) and k != world_rank
            },
            stopped_after(self.timeout),
        )
        atexit.register(self._tell_exit)
        digests = self._allgather_raw(digest(f"{topology.size}:{topology.fingerprint}"))
        if len(set(digests)) > 1:
            raise AgreementError(describe_disagreement("topology", digests))
        if world_size != topology.size:
            raise ValueError(
                f"MPI world size {world_size} does not match the topology's {topology.size} peers: "
                f"run mpiexec -n {topology.size}, or pick a topology with {world_size} peers"
            )
        super().__init__(topology, world_rank, timeout)

    def _first_dup(self, comm: MPIComm):
        """`comm.Dup()`, collective, within the timeout: a rank that never gets here (it failed or
        exited before) would otherwise hold the others in a blocking call for ever."""
        MPI = self._MPI
        new, request = comm.Idup()
        poller, status, rank = _Poller(self.timeout), MPI.Status(), comm.Get_rank()
        while not request.Test():
            if MPI.COMM_WORLD.Iprobe(source=MPI.ANY_SOURCE, tag=_WORLD_EXIT_TAG, status=status):
                raise CommunicationError(
                    f"rank {rank}: peer {status.Get_source()} ended its process "
                    "(sys.exit, or the end of its script) before it created "
                    "its communicator"
                )
            if not poller.idle():
                raise CommunicationError(
                    f"rank {rank}: not every rank created its communicator within "
                    f"{self.timeout:g} s (did one fail or exit before? raise comm_timeout if it is "
                    "just slow to start)"
                )
        return new

    # ---- point to point ------------------------------------------------------------------------
    def _exchange(self, send: Dict[int, Tensor], recv: Dict[int, Tensor]) -> None:
        MPI = self._MPI
        requests, keep_alive = [], []
        for j in send:
            message = send[j].detach()
            if message.device.type != "cpu" or not message.is_contiguous():
                message = message.to("cpu").contiguous()
            keep_alive.append(message)
            tag = _TAG_BASE + DTYPE_CODES[message.dtype]
            requests.append(self._comm.Isend([_byte_view(message), MPI.BYTE], dest=j, tag=tag))

        pending = list(recv)
        status = MPI.Status()
        poller = _Poller(self.timeout)
        while pending:
            progressed = False
            for j in list(pending):
                if self._comm.Iprobe(source=j, tag=MPI.ANY_TAG, status=status):
                    self._receive(j, status, recv[j])
                    pending.remove(j)
                    progressed = True
            if progressed:
                poller.progressed()
            elif not self._idle(poller, pending):
                raise self._timed_out(
                    pending,
                    f"no message from neighbour(s) {pending} within {self.timeout:g} s",
                    "is that peer alive? raise comm_timeout if it is just slow",
                )
        self._wait(requests, "sending to neighbours", list(send))
        del keep_alive

    def _receive(self, source: int, status, buffer: Tensor, comm: MPIComm | None = None) -> None:
        MPI = self._MPI
        comm = self._comm if comm is None else comm
        tag = status.Get_tag()
        dtype = CODE_DTYPES.get(tag - _TAG_BASE, f"<unknown tag {tag}>")
        self._check_message(source, status.Get_count(MPI.BYTE), dtype, buffer)
        in_place = buffer.device.type == "cpu" and buffer.is_contiguous()
        target = buffer if in_place else torch.empty(buffer.shape, dtype=buffer.dtype)
        comm.Recv([_byte_view(target), MPI.BYTE], source=source, tag=tag)
        if target is not buffer:
            buffer.copy_(target)

    def _sendrecv(self, dest, send: Tensor, source, recv: Tensor) -> None:
        MPI = self._MPI
        requests, message = [], None
        if dest is not None:
            message = send.detach()
            if message.device.type != "cpu" or not message.is_contiguous():
                message = message.to("cpu").contiguous()
            tag = _TAG_BASE + DTYPE_CODES[message.dtype]
            requests.append(
                self._ring_comm.Isend([_byte_view(message), MPI.BYTE], dest=dest, tag=tag)
            )
        if source is not None:
            status = MPI.Status()
            poller = _Poller(self.timeout)
            while not self._ring_comm.Iprobe(source=source, tag=MPI.ANY_TAG, status=status):
                if not self._idle(poller, [source]):
                    raise self._timed_out(
                        [source],
                        f"no all-reduce message from peer {source} within {self.timeout:g} s",
                        "is every peer alive and calling the same all-reduce?",
                    )
            self._receive(source, status, recv, self._ring_comm)
        self._wait(requests, "an all-reduce send", [dest] if dest is not None else [])
        del message

    def _wait(self, requests, what: str, peers: Optional[Sequence[int]] = None) -> None:
        """Wait for `requests`, which need `peers` (None: every other rank, a collective)."""
        if peers is None:
            peers = [k for k in range(self._comm.Get_size()) if k != self.rank]
        poller = _Poller(self.timeout)
        while not self._MPI.Request.Testall(requests):
            if not self._idle(poller, peers):
                raise self._timed_out(
                    list(peers),
                    f"{what} did not complete within {self.timeout:g} s",
                    "is every peer alive and calling the same operation?",
                )

    # ---- why peers leave ---------------------------------------------------------------------
    def _idle(self, poller: _Poller, peers: Sequence[int]) -> bool:
        """One idle moment of a wait for `peers`: read the peers' notices and raise if one of
        `peers` left; look whether one of them is stopped; False once the deadline has passed."""
        self._raise_if_left(peers)
        if self._watch.due():
            stopped = self._watch.check(peers)
            if stopped is not None:
                self._tell(_STOPPED, stopped, self._watch.after)
                raise CommunicationError(stopped_message(self.rank, stopped, self._watch.after))
        return poller.idle()

    def _read_notices(self) -> None:
        import numpy as np

        MPI = self._MPI
        status = MPI.Status()
        while self._notice_comm.Iprobe(source=MPI.ANY_SOURCE, tag=_NOTICE_TAG, status=status):
            notice = np.empty(3, dtype=np.float64)
            sender = status.Get_source()
            self._notice_comm.Recv([notice, MPI.BYTE], source=sender, tag=_NOTICE_TAG)
            self._notices.setdefault(sender, (tuple(float(v) for v in notice), time.monotonic()))

    def _raise_if_left(self, peers: Sequence[int], grace: bool = True) -> None:
        """Raise naming the cause if one of `peers` told us it left (repeating it to the others)."""
        self._read_notices()
        for peer in peers:
            if peer not in self._notices:
                continue
            (kind, culprit, seconds), read = self._notices[peer]
            if kind == _EXITED and grace and time.monotonic() - read < NOTICE_GRACE:
                continue  # its last message may still be on its way
            self._tell(kind, int(culprit), seconds)
            cause = _cause(kind, int(culprit), seconds)
            if int(culprit) == peer:
                raise CommunicationError(
                    f"rank {self.rank}: {cause}, while this rank waited for its message"
                )
            raise CommunicationError(f"rank {self.rank}: peer {peer} gave up because {cause}")

    def _timed_out(self, peers: List[int], what: str, hint: str) -> CommunicationError:
        """The error for a wait that ran out, naming the right peer: a cause a waited-for peer
        already told, else a stopped peer among `peers`; the others are told in turn."""
        deadline = time.monotonic() + NOTICE_GRACE  # the others that ran out with us tell whom
        while time.monotonic() < deadline:  # they waited for
            self._raise_if_left(peers, grace=False)
            time.sleep(0.01)
        stopped = self._watch.stopped_now(peers)
        if stopped:
            hint = f"peer {stopped[0]} is {STOPPED_HOW}"
        culprit = stopped[0] if stopped else (peers[0] if len(peers) == 1 else -1)
        self._tell(_STOPPED if stopped else _SILENT, culprit, self.timeout)
        return CommunicationError(f"rank {self.rank}: {what} ({hint})")

    def _tell(self, kind: float, culprit: int, seconds: float) -> None:
        """Send every other rank a notice, once per process; never waits (the sender is leaving)."""
        import numpy as np

        if self._told:
            return
        self._told = True
        notice = np.array([kind, culprit, seconds], dtype=np.float64)
        self._outbox.append(notice)
        for k in range(self._comm.Get_size()):
            if k != self.rank:
                self._outbox.append(
                    self._notice_comm.Isend([notice, self._MPI.BYTE], dest=k, tag=_NOTICE_TAG)
                )

    def _tell_exit(self) -> None:
        """At interpreter exit, with the communicator still open: tell the others this rank left."""
        MPI = self._MPI
        if self._closed or self._told or _failing or MPI.Is_finalized():
            return
        self._tell(_EXITED, self.rank, 0.0)
        requests = [r for r in self._outbox if isinstance(r, MPI.Request)]
        deadline = time.monotonic() + 1.0  # small messages leave at once; never hold up the exit
        while not MPI.Request.Testall(requests) and time.monotonic() < deadline:
            time.sleep(1e-3)

    def close(self) -> None:
        """Mark the communicator done: leaving the process afterwards is a normal end, which the
        peers are not told about (call it after the last operation, as `run_peers` does)."""
        self._closed = True

    # ---- collectives ---------------------------------------------------------------------------
    def _allgather_raw(self, data: bytes) -> List[bytes]:
        import numpy as np

        MPI = self._MPI
        size = self._comm.Get_size()
        send = np.frombuffer(data, dtype=np.uint8).copy()
        out = np.empty(size * len(data), dtype=np.uint8)
        self._wait(
            [self._comm.Iallgather([send, MPI.BYTE], [out, MPI.BYTE])],
            "an all-gather",
            [k for k in range(size) if k != self.rank],
        )
        return [out[k * len(data) : (k + 1) * len(data)].tobytes() for k in range(size)]

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        with self._one_at_a_time("an all-gather"):
            return self._allgather_raw(data)

    def abort(self, code: int = 1) -> None:
        """Kill every rank of the job (used when a failure is not shared by all ranks)."""
        self._comm.Abort(code)


def _cause(kind: float, culprit: int, seconds: float) -> str:
    """What a notice says, in words."""
    if kind == _EXITED:
        return (
            f"peer {culprit} ended its process (sys.exit, or the end of its script) before the "
            "others were done"
        )
    if kind == _STOPPED:
        return f"peer {culprit} has been {STOPPED_HOW} for {seconds:g} s"
    if culprit < 0:
        return f"its neighbours sent nothing within {seconds:g} s"
    return f"peer {culprit} sent nothing within {seconds:g} s (is it alive?)"
