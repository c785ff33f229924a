"""The MPI transport: one peer per MPI rank, raw buffers on the wire (never pickle).

Point-to-point messages use mpi4py's upper-case buffer methods on zero-copy byte views of contiguous
CPU tensors (tensors on another device are staged through the CPU). Sends are non-blocking and all
posted before any receive; receives are matched with a probe so that a message of the wrong size,
dtype or all-reduce op (dtype and op travel in the tag) is reported naming the sender before it
touches our buffer. Every wait polls with a deadline, so a silent or dead neighbour becomes an
error naming it rather than a hang.

Creating an `MPICommunicator` installs `abort_on_uncaught_exception`: an exception that escapes on
one rank (a plain script, no `main_guard`) ends every rank within a few seconds, naming the rank
that failed, instead of leaving the others to wait out their timeouts.

A rank that leaves in any other way tells the others why, on a private duplicate communicator (three
numbers: what happened, to which peer, for how long): a process that ends while its communicator is
open (`sys.exit` in user code, the end of a script that never calls `close`) says so at exit, a rank
that gives up on a peer (a timeout) says which peer, and a rank that was waiting for the one that
left repeats the cause it read. So every rank names the peer at the root of the failure, not the
live neighbour it was waiting for. A peer stopped, killed or cut off is found by the liveness
monitor (`faults`), which the waits consult, from before MPI_Init on (see `mpi_world._init`).
"""

from __future__ import annotations

import atexit
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import torch

from .base import (
    CODE_DTYPES,
    DTYPE_CODES,
    REDUCE_OPS,
    AgreementError,
    Communicator,
    CommunicationError,
    Tensor,
    as_topology,
    checked_timeout,
    describe_disagreement,
    digest,
)
from .. import faults
from . import mpi_world
from .mpi_world import (  # noqa: F401 - GRACE_SECONDS, exit_or_abort, tell_world_at_exit: re-exported
    _EXITED,
    _WORLD_EXIT_TAG,
    GRACE_SECONDS,
    _mpi,
    abort_on_uncaught_exception,
    exit_or_abort,
    tell_world_at_exit,
)

if TYPE_CHECKING:
    from mpi4py.MPI import Comm as MPIComm  # an mpi4py communicator, not the `Comm` protocol

    from topologies import Topology

_TAG_BASE = 1000
#: A ring all-reduce message's tag adds this times (1 + the op's index in REDUCE_OPS) to its dtype's.
_OP_TAG_STEP = 100
_NOTICE_TAG = 7
# What a notice says happened to its culprit (`_EXITED` also on COMM_WORLD, see `mpi_world`).
_SILENT = 3.0
#: Seconds a rank still looks for a peer's message after reading that the peer exited: the notice
#: travels on another communicator than the message, so it may arrive first.
NOTICE_GRACE = 1.0


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
        self.timeout = checked_timeout(timeout)
        MPI = _mpi()
        self._MPI = MPI
        abort_on_uncaught_exception()
        topology = as_topology(topology, "MPICommunicator")
        mpi_world.count_communicator()
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
        # Every rank's liveness announcement (pid, host, heartbeat addresses: `faults`), when this
        # communicator spans the launched ranks (the monitor counts in their ranks).
        self._monitor = faults.start() if world_size == MPI.COMM_WORLD.Get_size() > 1 else None
        if self._monitor is not None:
            self._monitor.join(self._allgather_raw(self._monitor.announce()), self.timeout)
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
            self._check_monitor()
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
        op_number, code = divmod(tag - _TAG_BASE, _OP_TAG_STEP)
        dtype = CODE_DTYPES.get(code, f"<unknown tag {tag}>")
        if comm is self._ring_comm:
            ops = (None, *REDUCE_OPS)
            got = ops[op_number] if 0 <= op_number < len(ops) else f"<unknown tag {tag}>"
            self._check_op(source, got, self._ring_op)
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
            op_number = 0 if self._ring_op is None else 1 + REDUCE_OPS.index(self._ring_op)
            tag = _TAG_BASE + DTYPE_CODES[message.dtype] + _OP_TAG_STEP * op_number
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
        `peers` left, or if the liveness monitor (`faults`) found any peer lost (stopped, killed,
        unreachable); False once the deadline has passed."""
        self._raise_if_left(peers)
        self._check_monitor()
        return poller.idle()

    def _check_monitor(self) -> None:
        """Raise if the liveness monitor found a peer lost (it has said so, and ends this rank)."""
        monitor = faults.current()
        if monitor is not None and monitor.event is not None:
            raise CommunicationError(f"rank {self.rank}: {monitor.event.text()}")

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
        already told, else what the liveness monitor finds about `peers` now (`faults`); the others
        are told in turn."""
        deadline = time.monotonic() + NOTICE_GRACE  # the others that ran out with us tell whom
        while time.monotonic() < deadline:  # they waited for
            self._raise_if_left(peers, grace=False)
            self._check_monitor()
            time.sleep(0.01)
        event = self._monitor.diagnose(peers) if self._monitor is not None else None
        if event is not None:
            raise CommunicationError(f"rank {self.rank}: {event.text()}")
        culprit = peers[0] if len(peers) == 1 else -1
        self._tell(_SILENT, culprit, self.timeout)
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
        if self._closed or self._told or mpi_world.failing() or MPI.Is_finalized():
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
        if self._monitor is not None:
            self._monitor.rest()

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
    if culprit < 0:
        return f"its neighbours sent nothing within {seconds:g} s"
    return f"peer {culprit} sent nothing within {seconds:g} s (is it alive?)"
