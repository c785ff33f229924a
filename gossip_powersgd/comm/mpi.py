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
"""

from __future__ import annotations

import sys
import time
import traceback
from typing import Dict, List

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

_TAG_BASE = 1000

#: How long a failing rank waits for the other ranks to fail too before it aborts the whole job.
GRACE_SECONDS = 5.0


def exit_or_abort(code: int) -> None:
    """End this rank with `code`; if some rank is still running after GRACE_SECONDS, abort the job.

    Every failing rank enters a non-blocking barrier. When all ranks failed (a bad config found by a
    collective check), all reach it and exit with their own message; when only some did, the
    others are busy elsewhere, the barrier never completes, and MPI_Abort takes the job down so that
    nobody waits for a peer that is gone.
    """
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

    def __init__(self, topology, comm=None, timeout: float | None = None):
        MPI = _mpi()
        self._MPI = MPI
        abort_on_uncaught_exception()
        topology = as_topology(topology, "MPICommunicator")
        # A private duplicate, so that our messages never match a user's receives.
        self._comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        # The all-reduce ring talks on its own duplicate, so its messages never match an exchange's.
        self._ring_comm = self._comm.Dup()
        world_rank, world_size = self._comm.Get_rank(), self._comm.Get_size()
        self.timeout = 120.0 if timeout is None else float(timeout)
        self.rank = world_rank  # needed by the raw all-gather below before the base class is set up
        digests = self._allgather_raw(digest(f"{topology.size}:{topology.fingerprint}"))
        if len(set(digests)) > 1:
            raise AgreementError(describe_disagreement("topology", digests))
        if world_size != topology.size:
            raise ValueError(
                f"MPI world size {world_size} does not match the topology's {topology.size} peers: "
                f"run mpiexec -n {topology.size}, or pick a topology with {world_size} peers"
            )
        super().__init__(topology, world_rank, timeout)

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
            elif not poller.idle():
                raise CommunicationError(
                    f"rank {self.rank}: no message from neighbour(s) {pending} within "
                    f"{self.timeout:g} s (is that peer alive? raise comm_timeout if it is just slow)"
                )
        self._wait(requests, "sending to neighbours")
        del keep_alive

    def _receive(self, source: int, status, buffer: Tensor, comm=None) -> None:
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
            requests.append(self._ring_comm.Isend([_byte_view(message), MPI.BYTE], dest=dest, tag=tag))
        if source is not None:
            status = MPI.Status()
            poller = _Poller(self.timeout)
            while not self._ring_comm.Iprobe(source=source, tag=MPI.ANY_TAG, status=status):
                if not poller.idle():
                    raise CommunicationError(
                        f"rank {self.rank}: no all-reduce message from peer {source} within "
                        f"{self.timeout:g} s (is every peer alive and calling the same all-reduce?)"
                    )
            self._receive(source, status, recv, self._ring_comm)
        self._wait(requests, "an all-reduce send")
        del message

    def _wait(self, requests, what: str) -> None:
        poller = _Poller(self.timeout)
        while not self._MPI.Request.Testall(requests):
            if not poller.idle():
                raise CommunicationError(
                    f"rank {self.rank}: {what} did not complete within {self.timeout:g} s "
                    "(is every peer alive and calling the same operation?)"
                )

    # ---- collectives ---------------------------------------------------------------------------
    def _allgather_raw(self, data: bytes) -> List[bytes]:
        import numpy as np

        MPI = self._MPI
        size = self._comm.Get_size()
        send = np.frombuffer(data, dtype=np.uint8).copy()
        out = np.empty(size * len(data), dtype=np.uint8)
        self._wait([self._comm.Iallgather([send, MPI.BYTE], [out, MPI.BYTE])], "an all-gather")
        return [out[k * len(data):(k + 1) * len(data)].tobytes() for k in range(size)]

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        with self._one_at_a_time("an all-gather"):
            return self._allgather_raw(data)

    def abort(self, code: int = 1) -> None:
        """Kill every rank of the job (used when a failure is not shared by all ranks)."""
        self._comm.Abort(code)
