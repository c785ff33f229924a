"""All peers inside one process, one thread each: simulate 64 peers on a laptop, test without MPI.

`LocalCluster(topology).run(fn, *args)` calls `fn(comm, *args)` once per peer, each in its own
thread with its own `LocalCommunicator`, and returns the return values by rank. Messages travel
through in-memory mailboxes as copies of the sent bytes, so a peer can reuse its send buffer as soon
as `exchange` returns, exactly as with MPI. If any peer raises, every other peer is released from
whatever it waits on (it raises `PeerAborted`), and `run` re-raises the first real error: a failure
never turns into a hang.

When peers outnumber cores, the threads take turns: one peer runs at a time (or one per lane, see
`LocalCluster`'s `lanes`), until it waits for a message or a collective (see `comm.turns.Turns` and
`LocalCluster`'s `cooperative`): the same messages and bits as free-running threads
(experiments/results/bench_sim.md times both at 64 peers).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from .base import (
    Communicator,
    CommunicationError,
    PeerAborted,
    Tensor,
    _combine_,
    as_topology,
    nbytes,
    ring_allreduce_bytes,
    ring_chunks,
)
from .local_shared import _Shared

if TYPE_CHECKING:
    from topologies import Topology

_POLL_SECONDS = 0.05
#: After Ctrl-C, how long `run` waits for the peer threads to stop before it re-raises anyway.
_INTERRUPT_GRACE_SECONDS = 5.0
#: What `LocalCluster.run` warns when peers that ran at once drew from torch's global RNG.
GLOBAL_RNG_WARNING = (
    "LocalCluster: peers running at once used torch's global RNG (torch.manual_seed, torch.randn, "
    "default layer initialisation...), so the results change from run to run: give each peer its "
    "own torch.Generator and pass it explicitly (see the LocalCluster docstring)"
)


class LocalCommunicator(Communicator):
    """One peer's view of an in-process cluster. Made by `LocalCluster.run`, not by hand."""

    #: All-reduce through shared memory (same bits and counts as the point-to-point ring, which
    #: `False` runs instead: the tests compare the two).
    shared_memory_allreduce = True

    def __init__(
        self, topology: Topology, rank: int, shared: _Shared, timeout: float | None = None
    ):
        super().__init__(topology, rank, timeout)
        self._shared = shared
        self.check_agreement("topology", f"{topology.size}:{topology.fingerprint}")

    @property
    def takes_turns(self) -> bool:
        """Whether this cluster's peer threads take turns (see `LocalCluster`'s `cooperative`)."""
        return self._shared.turns is not None

    def _raise_if_aborted(self) -> None:
        if self._shared.aborted.is_set():
            if self._shared.interrupted:
                raise PeerAborted(f"rank {self.rank}: stopping because the run was interrupted")
            raise PeerAborted(
                f"rank {self.rank}: stopping because peer {self._shared.failed_rank} failed"
            )

    def _exchange(self, send: Dict[int, Tensor], recv: Dict[int, Tensor]) -> None:
        self._raise_if_aborted()
        copies: Dict[int, Tensor] = {}
        for j in send:
            # A copy, because the sender may overwrite its buffer as soon as exchange returns; one
            # per distinct buffer, since receivers only read it (gossip often sends one to all).
            buffer = send[j]
            if id(buffer) not in copies:
                # No detach (nor a view, below) unless needed: with two lanes
                # (`LocalCluster(lanes=2)`) every PyTorch call made from Python lets the other
                # lane's peer take the GIL, and each such hand-over costs a context switch
                # (measured 1.14x slower at 64 peers with them).
                # Contiguous, in the tensor's logical order, as MPI and torch send it: a clone that
                # kept a transposed tensor's strides could not be viewed in a flat receive buffer.
                copies[id(buffer)] = (buffer.detach() if buffer.requires_grad else buffer).clone(
                    memory_format=torch.contiguous_format
                )
            self._shared.post(self.rank, j, copies[id(buffer)])
        deadline = time.monotonic() + self.timeout
        for j in recv:
            self._receive(j, "exchange", recv[j], deadline, "neighbour")

    def _sendrecv(self, dest, send: Tensor, source, recv: Tensor) -> None:
        self._raise_if_aborted()
        if dest is not None:  # the op travels with the message, as in MPI's tag
            self._shared.post(self.rank, dest, (send.detach().clone(), self._ring_op), "ring")
        if source is not None:
            self._receive(source, "ring", recv, time.monotonic() + self.timeout, "peer")

    def _receive(
        self, source: int, channel: str, buffer: Tensor, deadline: float, role: str
    ) -> None:
        key = (source, self.rank, channel)
        box = self._shared.mailbox(*key)
        message = None
        if self._shared.turns is not None:
            message = self._shared.turns.receive(
                key, box, lambda: self._check_waiting(source, deadline, role)
            )
        if message is None:
            message = self._wait_for(box, source, deadline, role)
        if channel == "ring":
            message, op = message
            self._check_op(source, op, self._ring_op)
        self._check_message(source, message.numel() * message.element_size(), message.dtype, buffer)
        buffer.copy_(message if message.shape == buffer.shape else message.view(buffer.shape))

    def _wait_for(
        self, box: "queue.SimpleQueue", source: int, deadline: float, role: str
    ) -> Tensor:
        while True:
            try:
                return box.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                self._check_waiting(source, deadline, role)

    def _check_waiting(self, source: int, deadline: float, role: str) -> None:
        self._raise_if_aborted()
        if time.monotonic() > deadline:
            raise CommunicationError(
                f"rank {self.rank}: no message from {role} {source} within {self.timeout:g} s "
                f"(is peer {source} alive? raise the timeout if it is just slow)"
            ) from None

    def _ring_allreduce(self, tensor: Tensor, op: str) -> Tuple[int, int]:
        """The ring all-reduce's bits and byte counts, computed through shared memory.

        Peers of one process can read each other's tensors, so instead of the ring's 2(n-1)
        hand-offs (each a wake-up of every peer thread, which dominates at 64+ peers) each peer
        computes the one chunk the ring would have it finish, chunk r+1, adding the ranks'
        chunks in the ring's order (c, c+1, ..., c-1; addition of two floats is commutative, so
        the operand order of each add does not matter, only this sequence), and then everyone
        copies every finished chunk: the same bits as the point-to-point ring that MPI and torch
        run (tested), after two barriers. It is charged what that ring sends, because that is
        what a run on those transports moves.
        """
        if not self.shared_memory_allreduce:
            return super()._ring_allreduce(tensor, op)
        self._raise_if_aborted()
        shared, n, r = self._shared, self.size, self.rank
        work = tensor.detach()
        flat = work.view(-1) if work.is_contiguous() else work.reshape(-1).clone()
        bounds = ring_chunks(flat.numel(), n)
        shared.slots[r], shared.ops[r] = flat, op
        self._wait_barrier()  # every peer's tensor is in place
        inputs, ops = list(shared.slots), list(shared.ops)
        left = (r - 1) % n
        # Like the ring, each peer checks what its left neighbour contributes; a peer whose
        # neighbours agree waits for the one that noticed (it fails the barrier below).
        self._check_op(left, ops[left], op)
        if inputs[left].dtype != flat.dtype or inputs[left].numel() != flat.numel():
            self._check_message(left, nbytes(inputs[left]), inputs[left].dtype, flat)
        if all(x.dtype == flat.dtype and x.numel() == flat.numel() for x in inputs) and all(
            o == op for o in ops
        ):
            c = (r + 1) % n
            start, stop = bounds[c]
            finished = inputs[c][start:stop].clone()
            for k in range(1, n):
                _combine_(finished, inputs[(c + k) % n][start:stop], op)
            if op == "mean":
                finished.div_(n)
            shared.results[c] = finished
        self._wait_barrier()  # every chunk is finished; nobody reads the inputs any more
        for c, (start, stop) in enumerate(bounds):
            flat[start:stop].copy_(shared.results[c])
        if not work.is_contiguous():
            work.copy_(flat.view(work.shape))
        # What the ring sends: every chunk but r+1 (reduce-scatter) and every chunk but r+2
        # (all-gather); empty chunks do not travel.
        messages = sum(
            1
            for skip in (1, 2)
            for c, (start, stop) in enumerate(bounds)
            if c != (r + skip) % n and stop > start
        )
        return ring_allreduce_bytes(flat.numel(), flat.element_size(), n, r), messages

    def _wait_barrier(self) -> None:
        try:
            with self._shared.released():
                self._shared.barrier.wait(timeout=self.timeout)
        except threading.BrokenBarrierError:
            self._raise_if_aborted()
            raise CommunicationError(
                f"rank {self.rank}: a collective did not complete within {self.timeout:g} s "
                "(did every peer call it?)"
            ) from None

    def _allgather_tensor(self, tensor: Tensor) -> List[Tensor]:
        shared = self._shared
        shared.slots[self.rank] = tensor.detach().clone()
        self._wait_barrier()  # every peer has deposited
        gathered = list(shared.slots)
        self._wait_barrier()  # every peer has read before the next collective overwrites the slots
        for k, other in enumerate(gathered):
            if other.dtype != tensor.dtype or other.numel() != tensor.numel():
                raise CommunicationError(
                    f"rank {self.rank}: all-gather got {other.numel()} x {other.dtype} "
                    f"from peer {k}, expected {tensor.numel()} x {tensor.dtype}"
                )
        return [other.view(tensor.shape).to(tensor.device) for other in gathered]


class LocalCluster:
    """Run one function on every peer of `topology`, one thread per peer, in this process.

    `timeout` is how long a peer waits for a neighbour or a collective before it raises (seconds).

    `cooperative` decides how the peer threads share the cores. True: one peer runs at a time (per
    lane, below), and the turn passes on whenever a peer waits for a message or a collective
    (`comm.turns.Turns`). False: all threads run freely and the GIL decides. The messages and the
    results' bits are the same either way; experiments/results/bench_sim.md times both (64
    ResNet-20 peers on 2 cores; its last run was on a loaded machine, where free threads came out
    ahead). None (the default) takes turns exactly when there are more peers than cores. A peer that blocks outside the communicator while it
    has the turn (a sleep, an event another peer sets) holds up the peers able to run for up to
    5 s each time (then they run anyway): pass False for such code.

    `pin` (Linux) decides where the peer threads of a cluster that takes turns run. True keeps them
    on as many cores as the caller's intra-op thread count (`torch.get_num_threads()`), starting
    with the core the caller is on, each lane on cores of its own. Only one peer per lane computes
    at a time, so the other cores are not missed, and keeping the threads together was measured
    faster (1.16x at 64 peers with one lane: experiments/results/bench_sim.md as of commit
    ad7d87a), presumably because the messages just written and the
    interpreter's own data stay in that core's caches instead of moving with every hand-over.
    Anything a pinned peer thread starts (threads, DataLoader worker processes) inherits its cores:
    pass False to leave the threads where the operating system puts them. None (the default)
    pins whenever the threads take turns. Free-running threads are never pinned.

    `lanes` (taking turns only) is how many peers run at once: the peers are cut into `lanes`
    blocks of consecutive ranks, and each block takes turns on its own (pinned, each block on
    its own cores). Two peers running at once only gain where their work runs without the GIL:
    PowerGossip's tensor work does (it is compiled with TorchScript), so 64 ResNet-20 peers of
    PowerGossip on 2 cores run faster with `lanes=2` and one intra-op thread
    (experiments/results/bench_sim.md); algorithms made of many small Python-driven operations
    (Choco-SGD, DeepSqueeze) can run slower, since the two running peers then hand the GIL back
    and forth.
    The default, 1, runs one peer at a time. The bits are the same whatever the lanes.
    `lanes` > 1 with `cooperative=False` is refused (free threads have no lanes); with
    `cooperative=None` it applies when the cluster takes turns (more peers than cores), and
    otherwise every peer runs at once anyway.

    Randomness: the peers are threads of one process and share torch's global RNG. Where peers run
    at once (free threads, the default when there are no more peers than cores, or `lanes` > 1),
    the order in which they draw from it (`torch.manual_seed`, `torch.randn`, a layer's default
    initialisation, dropout) changes from run to run, and so do the results. Give each peer its
    own `torch.Generator` (seeded from its rank) and pass it explicitly, e.g. build the model with
    `torch.nn.utils.skip_init` and fill it with `torch.nn.init.normal_(p, generator=g)` (the
    README's example): then the runs are bit-identical. `run` warns (a RuntimeWarning, once per
    run) when the global CPU generator's state changed during a run whose peers could run at once.
    """

    def __init__(
        self,
        topology: Topology,
        timeout: float | None = None,
        cooperative: Optional[bool] = None,
        pin: Optional[bool] = None,
        lanes: int = 1,
    ):
        self.topology = as_topology(topology, "LocalCluster")
        self.timeout = timeout
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise ValueError(
                f"LocalCluster: lanes must be a whole number >= 1 (peers running at once), "
                f"got {lanes!r}"
            )
        if cooperative is False and lanes > 1:
            # Free-running threads all run at once: a lane count would be silently ignored.
            raise ValueError(
                f"LocalCluster: lanes={lanes} applies only when peers take turns, but "
                "cooperative=False runs every peer at once; pass cooperative=True to "
                f"run {lanes} peers at a time, or drop lanes"
            )
        if cooperative is None:
            cooperative = self.topology.size > (os.cpu_count() or 1)
        self.cooperative = bool(cooperative)
        self.pin = self.cooperative if pin is None else bool(pin) and self.cooperative
        self.lanes = min(lanes, self.topology.size) if self.cooperative else 1

    @property
    def size(self) -> int:
        return self.topology.size

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> List[Any]:
        shared = _Shared(self.topology.size, self.cooperative, self.lanes)
        results: List[Any] = [None] * shared.size
        errors: List[Optional[BaseException]] = [None] * shared.size
        intra_op_threads = torch.get_num_threads()
        cores = peer_cores(intra_op_threads, self.lanes) if self.pin else None

        def peer(rank: int) -> None:
            # OpenMP keeps the thread count per thread: a new thread would otherwise run every
            # tensor operation on the default team (all cores) whatever the caller set, which
            # with many peers means thousands of needless wake-ups per step.
            torch.set_num_threads(intra_op_threads)
            # consecutive ranks share a lane: on ring-like graphs most neighbours are in it
            lane = rank * self.lanes // shared.size
            if cores is not None:
                os.sched_setaffinity(0, cores[lane])  # 0: this thread, not the process
            if shared.turns is not None:
                shared.turns.enter(lane)
            try:
                comm = LocalCommunicator(self.topology, rank, shared, self.timeout)
                results[rank] = fn(comm, *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
                errors[rank] = exc
                shared.abort(rank)
            finally:
                if shared.turns is not None:
                    shared.turns.give()

        # Peers that may run at once must not share torch's global RNG (see the class docstring).
        concurrent = shared.size > 1 and (not self.cooperative or self.lanes > 1)
        rng_before = rng_sentinel = None
        if concurrent:
            # A fresh seed, so that a peer leaving the generator as it found it is still seen (a
            # peer seeding the value it already had would otherwise go unnoticed); the caller's
            # state comes back below when no peer touched the generator.
            rng_before = torch.default_generator.get_state()
            torch.default_generator.manual_seed(int.from_bytes(os.urandom(8), "little"))
            rng_sentinel = torch.default_generator.get_state()
        threads = [
            threading.Thread(target=peer, args=(rank,), name=f"peer-{rank}", daemon=True)
            for rank in range(shared.size)
        ]
        for thread in threads:
            thread.start()
        try:
            self._join(threads, shared)
        finally:
            rng_used = rng_sentinel is not None and not torch.equal(
                rng_sentinel, torch.default_generator.get_state()
            )
            if rng_before is not None and not rng_used:
                torch.default_generator.set_state(rng_before)
        first = shared.failed_rank
        if first is not None and not isinstance(errors[first], PeerAborted):
            raise errors[first]
        real = [e for e in errors if e is not None and not isinstance(e, PeerAborted)]
        if real:
            raise real[0]
        aborted = [e for e in errors if e is not None]
        if aborted:
            raise aborted[0]
        if rng_used:
            warnings.warn(GLOBAL_RNG_WARNING, RuntimeWarning, stacklevel=2)
        return results

    @staticmethod
    def _join(threads, shared) -> None:
        """Wait for every peer thread; on Ctrl-C stop them (see `run`)."""
        try:
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:
            # Ctrl-C reaches the main thread only: tell every peer to stop at its next exchange or
            # collective, give them a moment to unwind, and let the interrupt go on to the caller.
            shared.interrupted = True
            shared.abort(-1)
            deadline = time.monotonic() + _INTERRUPT_GRACE_SECONDS
            for thread in threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            raise


def peer_cores(count: int, lanes: int = 1) -> Optional[List[set]]:
    """For pinned peer threads, `count` of the cores this thread may run on for each of `lanes`
    lanes, the one it runs on now first, the next lane's after them (lanes share cores only when
    there are too few); None where threads cannot be pinned (not Linux) or where `count` cores is
    all of them anyway."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    count = max(1, count)
    if count >= len(allowed):
        return None
    try:
        with open("/proc/thread-self/stat") as f:
            # field 39, "processor"; the fields after the command's closing parenthesis start at 3
            current = int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        current = allowed[0]
    start = allowed.index(current) if current in allowed else 0
    return [
        {allowed[(start + lane * count + k) % len(allowed)] for k in range(count)}
        for lane in range(lanes)
    ]


def run_local(topology: Topology, fn: Callable[..., Any], *args, **kwargs) -> List[Any]:
    """Shorthand for `LocalCluster(topology).run(fn, *args, **kwargs)`."""
    return LocalCluster(topology).run(fn, *args, **kwargs)


__all__ = ["LocalCluster", "LocalCommunicator", "peer_cores", "run_local"]
