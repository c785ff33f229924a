"""The torch.distributed transport: one peer per process, launched by torchrun or mpiexec.

    torchrun --nproc-per-node N python -m ...        (sets RANK, WORLD_SIZE, MASTER_ADDR/PORT)
    mpiexec -n N python -m ...                       (PMI_RANK/PMI_SIZE or OMPI_COMM_WORLD_* are
                                                      mapped to RANK/WORLD_SIZE; MASTER_ADDR
                                                      defaults to 127.0.0.1, MASTER_PORT to 29500)

gloo moves CPU tensors, NCCL CUDA tensors, which stay on the device (no host staging). Messages are
raw tensors, never pickled objects. Before every exchange each peer sends its neighbours a
two-number header (byte size, dtype), and before every all-reduce its ring neighbour one (size,
dtype, op), so that a wrong message is reported naming the sender instead of corrupting a buffer or
hanging; headers are envelope, like MPI's tag and count, and not counted as traffic. Every wait
polls with a deadline, so a silent or dead peer becomes an error naming it.

A rank whose wait fails names the peer at the root of it: one stopped, killed or cut off, found by
the liveness monitor (`faults`), or one that ended its process with its communicator open, read
from the rendezvous store (`torch_faults`).
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..utils import format_ranks
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
    nbytes,
)
from .. import faults
from .interfaces import bind_gloo_to_route
from .mpi import GRACE_SECONDS
from .torch_faults import PeerWatch, undelivered
from .torch_launch import launcher_environment, resolve_device
from .torch_members import (
    before_transfer,
    end_helpers,
    GroupNotBuilt,
    next_group,
    raise_if_lost,
    watched_wait,
)

if TYPE_CHECKING:
    from topologies import Topology

# The store of the process's latest communicator, for `exit_after_peers`.
_store_for_exit: Optional[Tuple[object, int]] = None
_instances = 0
_failing = False  # set by exit_after_peers: a failing rank's peers learn it from its own line


class TorchCommunicator(Communicator):
    """One peer per torch.distributed process, on `topology`.

    `device` is where the tensors live ("cpu", default, with gloo; "cuda" or "cuda:K" with NCCL,
    "cuda" meaning the LOCAL_RANK-th GPU). The constructor is collective: all ranks compare the
    topology's fingerprint, the world size and the device type through the rendezvous store, and
    any disagreement raises the same one-line error on every rank. `timeout` (seconds) bounds the
    rendezvous and every wait for a neighbour or a collective.
    """

    _rejoined = False  # a process of gossip-train --rejoin (`torch_rejoin`)

    def __init__(
        self,
        topology: Topology,
        device=None,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
    ):
        global _store_for_exit, _instances
        self.timeout = checked_timeout(timeout)
        topology = as_topology(topology, "TorchCommunicator")
        device, backend = resolve_device(device, backend)
        rank, world_size = launcher_environment()
        self.rank = rank
        self._monitor = faults.start(rank, world_size)  # liveness, from before the rendezvous
        wait = datetime.timedelta(seconds=self.timeout)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            store = self._rendezvous(wait)
        else:
            store = dist.distributed_c10d._get_default_store()
        _instances += 1
        self._store = dist.PrefixStore(f"gossip_powersgd/{_instances}/", store)
        self._claim_rank()
        _store_for_exit = (self._store, world_size)  # only a store of this job's own
        self._agree_before_joining(topology, world_size, device)
        if self._owns_group:
            # peers on other hosts must reach this one where gloo listens
            bind_gloo_to_route(
                self._store, rank, world_size, os.environ["MASTER_ADDR"], self.timeout
            )
            # gloo carries the CPU control data (agreement checks, all-gathers) in either case.
            dist.init_process_group(
                "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo",
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=wait + datetime.timedelta(seconds=GRACE_SECONDS),
            )
            # Leave the group before the interpreter tears down: gloo's threads still running at
            # exit make the C++ runtime abort the process ("terminate called ...", SIGABRT).
            atexit.register(self._close_at_exit)
        self.device, self.backend = device, backend
        #: on_peer_loss: continue: what interrupts waits, the epoch's group (`torch_members`)
        self.interrupted: Optional[Callable[[], Optional[str]]] = None
        self.group = None  # a `torch_members.MemberGroup`
        super().__init__(topology, rank, timeout)
        self._faults = PeerWatch(self._store, rank, world_size, self._monitor)
        atexit.register(self._tell_exit)  # runs before close (atexit is last in, first out)

    def _rendezvous(self, wait: datetime.timedelta):
        """Connect to the launcher's store; a failure is one line naming this rank and the timeout
        (torch's own error is a multi-line C++ trace that names neither)."""
        try:
            store, _, _ = next(dist.rendezvous("env://", timeout=wait))
        except (RuntimeError, ValueError) as exc:  # DistNetworkError and DistStoreError among them
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
            where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            if "EADDRINUSE" in first or "address already in use" in first.lower():
                raise CommunicationError(
                    f"rank {self.rank}: port {where} is already in use (another job on this "
                    "host, or a process still holding it): give this job a free port, "
                    "MASTER_PORT=... (torchrun --master-port), the same on every rank"
                ) from None
            raise CommunicationError(
                f"rank {self.rank}: could not join the process group at {where} within "
                f"{self.timeout:g} s ({first}): raise the timeout (comm_timeout in a config) if the peers "
                "are just slow to start, and check that MASTER_ADDR and MASTER_PORT reach rank 0"
            ) from None
        return store

    def _claim_rank(self) -> None:
        """Take this rank's place in the store, refused if a process already took it: one of
        another job on the same MASTER_PORT (the default 29500 under mpiexec), whose store this
        rank reached because its own rank 0 could not listen there. Before, such a rank passed the
        set-up checks against the other job's keys and then talked to its peers. A --rejoin
        process comes back to its own place (`torch_rejoin`)."""
        if not self._rejoined and self._store.add(f"claim/{self.rank}", 1) > 1:
            where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            raise CommunicationError(
                f"rank {self.rank}: another process already joined as rank {self.rank} at "
                f"{where} (two jobs on one port?): give each job its own free port, "
                "MASTER_PORT=... (torchrun --master-port), the same on every rank"
            )

    def _agree_before_joining(
        self, topology: Topology, world_size: int, device: torch.device
    ) -> None:
        """Compare what every rank must share through the store (raw strings, not pickles), with
        each rank's liveness announcement (`faults`)."""
        announce = self._monitor.announce() if self._monitor is not None else b""
        mine = (
            f"{digest(f'{topology.size}:{topology.fingerprint}').hex()}|{device.type}|"
            f"{announce.hex()}"
        )
        self._store.set(f"hello/{self.rank}", mine)
        keys = [f"hello/{k}" for k in range(world_size)]
        self._wait_for_keys(keys, world_size)
        hellos = [self._store.get(k).decode().split("|") for k in keys]
        if self._monitor is not None and all(len(h) == 3 and h[2] for h in hellos):
            self._monitor.join([bytes.fromhex(h[2]) for h in hellos], self.timeout)
        topologies_seen = [bytes.fromhex(h[0]) for h in hellos]
        if len(set(topologies_seen)) > 1:
            raise AgreementError(describe_disagreement("topology", topologies_seen))
        if world_size != topology.size:
            raise ValueError(
                f"torch.distributed world size {world_size} does not match the topology's "
                f"{topology.size} peers: run torchrun --nproc-per-node {topology.size}, or pick a "
                f"topology with {world_size} peers"
            )
        devices = [h[1] for h in hellos]
        if len(set(devices)) > 1:
            parts = [
                f"ranks {format_ranks(k for k, d in enumerate(devices) if d == kind)} use {kind}"
                for kind in sorted(set(devices))
            ]
            raise AgreementError(
                "device type differs across ranks: "
                + "; ".join(parts)
                + " (give every peer the same device)"
            )

    def _wait_for_keys(self, keys: List[str], world_size: int) -> None:
        """Wait for every rank's key in the store, looking at the liveness monitor meanwhile (a
        rank stopped or gone is named there); past the timeout, name the ranks missing."""
        deadline = time.monotonic() + self.timeout
        while not self._store.check(keys):
            if self._monitor is not None and self._monitor.event is not None:
                raise CommunicationError(f"rank {self.rank}: {self._monitor.event.text()}")
            if time.monotonic() > deadline:
                missing = [k for k, key in enumerate(keys) if not self._store.check([key])]
                raise CommunicationError(
                    f"rank {self.rank}: ranks {format_ranks(missing)} did not join within "
                    f"{self.timeout:g} s (did the launcher start WORLD_SIZE={world_size} "
                    "processes?)"
                )
            time.sleep(0.05)

    # ---- point to point ------------------------------------------------------------------------
    def _on_device(self, tensor: Tensor, what: str) -> Tensor:
        if tensor.device != self.device:
            raise ValueError(
                f"rank {self.rank}: {what} is on {tensor.device} but this communicator "
                f"moves tensors on {self.device}: create it with device={tensor.device}"
                " or move the tensors"
            )
        return tensor

    def _header(self, *values: int) -> Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _exchange(self, send: Dict[int, Tensor], recv: Dict[int, Tensor]) -> None:
        headers_in = {j: self._header(-1, -1) for j in recv}
        self._transfer(
            [(j, self._header(nbytes(send[j]), DTYPE_CODES[send[j].dtype])) for j in send],
            list(headers_in.items()),
            "neighbour(s)",
        )
        for j in recv:
            size, code = headers_in[j].tolist()
            self._check_message(j, size, CODE_DTYPES.get(code, f"<unknown code {code}>"), recv[j])
        outgoing = [
            (j, self._on_device(send[j].detach(), f"the message for peer {j}").contiguous())
            for j in send
        ]
        incoming = [(j, self._on_device(recv[j], "a receive buffer")) for j in recv]
        self._transfer(outgoing, incoming, "neighbour(s)")

    def _sendrecv(self, dest, send: Tensor, source, recv: Tensor) -> None:
        outgoing = [(dest, send)] if dest is not None else []
        self._transfer(outgoing, [(source, recv)] if source is not None else [], "peer")

    def _transfer(
        self, outgoing: List[Tuple[int, Tensor]], incoming: List[Tuple[int, Tensor]], role: str
    ) -> None:
        """Send each (peer, tensor) of `outgoing` and fill each (peer, buffer) of `incoming`."""
        if not outgoing and not incoming:
            return
        before_transfer(self, incoming)  # on_peer_loss: continue (`torch_members`)
        peers = [j for j, _ in outgoing + incoming]

        def post():
            if self.group is not None:  # the members' group of this epoch, by position
                works = [self.group.send(out, j) for j, out in outgoing]
                return works + [self.group.recv(into, j) for j, into in incoming]
            return dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, out, j) for j, out in outgoing]
                + [dist.P2POp(dist.irecv, into, j) for j, into in incoming]
            )

        works = self._post(post, role, [j for j, _ in incoming], peers)
        self._wait(works, [j for j, _ in incoming], role, peers)

    def _post(self, post, role: str, senders: List[int], peers: Optional[List[int]] = None):
        """`post()`'s works. gloo refuses to post on a connection already closed (a peer that died
        between two operations: "Connection closed by peer"), raising at once: handled as a
        failed wait, so that under on_peer_loss: continue it is the lost peer's `PeerLostError`."""
        try:
            return post()
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            everyone = [k for k in range(self.size) if k != self.rank]
            raise_if_lost(self._monitor, peers or everyone, self.interrupted)
            raise self._failure(
                f"talking to {role} {senders} failed ({first}); did a peer stop?", peers or everyone
            ) from None

    def _wait(
        self, works, peers: List[int], role: str, works_peers: Optional[List[int]] = None
    ) -> None:
        """Wait for `works` (whose peers are `works_peers`; None: every other rank), naming
        `peers` (the senders) if they fail or time out."""
        # gloo's p2p requests report completion only through wait(): wait on each, one deadline
        everyone = [k for k in range(self.size) if k != self.rank]
        deadline = time.monotonic() + self.timeout
        for k, w in enumerate(works):
            left = max(deadline - time.monotonic(), 0.001)
            try:
                if self.interrupted is None:
                    finished = w.wait(datetime.timedelta(seconds=left))
                else:
                    finished = watched_wait(w, left, self.interrupted, self.group)
            except RuntimeError as exc:
                text = str(exc).lower()
                if "timed out" in text or "timeout" in text:
                    finished = False
                else:
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise_if_lost(self._monitor, works_peers or everyone, self.interrupted)
                    raise self._failure(
                        f"talking to {role} {peers} failed ({first}); did a peer stop?",
                        everyone if works_peers is None else works_peers,
                    ) from None
            if finished is False:
                raise_if_lost(self._monitor, works_peers or everyone, self.interrupted)
                if works_peers is not None:  # name the senders that did not deliver
                    first = len(works) - len(peers)  # the receives come last, one per sender
                    receives = [
                        (w, peer)
                        for i, (w, peer) in enumerate(zip(works[first:], peers))
                        if first + i >= k
                    ]
                    peers = undelivered(receives) or peers
                raise self._faults.timed_out(
                    f"no message from {role} {peers} within "
                    f"{self.timeout:g} s (is that peer alive? raise "
                    "comm_timeout if it is just slow)",
                    peers,
                )

    def _failure(self, what: str, peers: Optional[List[int]] = None) -> CommunicationError:
        return self._faults.failure(what, peers or [])

    def set_members(self, number: int, live) -> None:
        """From now on, a fresh group of the peers `live` (collective over them: `MemberGroup`).
        A member that does not join it ends the run, named as a failed wait is (`_failure`)."""
        try:
            self.group = next_group(self, number, live)
        except GroupNotBuilt as exc:
            raise self._failure(str(exc).split(": ", 1)[1], exc.absent) from exc

    def _tell_exit(self) -> None:
        """At interpreter exit, with the communicator still open: record that this rank left."""
        if self._owns_group and dist.is_initialized() and not _failing:
            self._faults.tell_exit()

    # ---- collectives ---------------------------------------------------------------------------
    def _ring_allreduce(self, tensor: Tensor, op: str) -> Tuple[int, int]:
        self._on_device(tensor, "the all-reduced tensor")
        n = self.size
        right, left = (self.rank + 1) % n, (self.rank - 1) % n
        mine = (tensor.numel(), DTYPE_CODES[tensor.dtype], REDUCE_OPS.index(op))
        theirs = self._header(-1, -1, -1)
        self._sendrecv(right, self._header(*mine), left, theirs)
        theirs = tuple(theirs.tolist())
        if theirs != mine:

            def describe(h):
                return f"{h[0]} x {CODE_DTYPES.get(h[1], '?')} ({REDUCE_OPS[h[2]]})"

            raise CommunicationError(
                f"rank {self.rank}: all-reduce of {describe(mine)} here, but peer {left} reduces "
                f"{describe(theirs)} (do all peers run the same algorithm on the same model?)"
            )
        return super()._ring_allreduce(tensor, op)

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        if self.group is not None:  # the members' of this epoch (the end-of-run barrier's)
            return self.group.allgather_bytes(data, self._post, self._wait)
        with self._one_at_a_time("an all-gather"):
            mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            out = [torch.empty_like(mine) for _ in range(self.size)]
            work = self._post(
                lambda: dist.all_gather(out, mine, async_op=True), "an all-gather with peers", []
            )
            self._wait([work], [], "an all-gather with peers")
        return [bytes(t.numpy().tobytes()) for t in out]

    def close(self) -> None:
        """Leave the process group (if this communicator created it), once every rank has called
        `close` too, or after GRACE_SECONDS.

        Leaving closes this rank's gloo connections; a peer still inside its last collective (the
        all-gather of a barrier ends on one rank before it ends on the next) then reads a closed
        connection in a gloo thread, which aborts that process ("terminate called after throwing
        an instance of 'gloo::IoException'", SIGABRT). So the ranks first meet in the rendezvous
        store, which no gloo operation uses: when the last one arrives, every rank is out of its
        collectives. A rank whose peers never arrive (one failed) leaves after GRACE_SECONDS."""
        if self._monitor is not None:
            self._monitor.rest()
        if (self._owns_group and dist.is_initialized() or self._rejoined) and not _failing:
            try:
                arrived = self._store.add("closing", 1)
                deadline = time.monotonic() + GRACE_SECONDS
                size = len(self.group.live) if self.group is not None else self.size
                while arrived < size and time.monotonic() < deadline:
                    time.sleep(0.01)
                    arrived = self._store.add("closing", 0)
            except Exception:  # noqa: BLE001 - the store may have ended with its host: leave
                pass
        self._close_at_exit()

    def _close_at_exit(self) -> None:
        """Leave the process group now (at interpreter exit: gloo's threads still running then
        make the C++ runtime abort the process, SIGABRT), after ending the waits that
        on_peer_loss: continue left pending on its groups (`torch_members.end_helpers`)."""
        if self._owns_group and dist.is_initialized():
            end_helpers(self)
            dist.destroy_process_group()
            self._owns_group = False


def exit_after_peers(code: int) -> None:
    """End this process with `code`, first giving the other ranks GRACE_SECONDS to fail too.

    When every rank failed (a disagreement found by a collective check) each prints its own line
    before any exits, so a launcher that stops the job at the first exit cuts nobody's message off;
    when only some did, the wait runs out and the launcher takes the others down; under
    on_peer_loss: continue this rank then tells the others it is lost (`faults.fail`), and they
    go on without it. A rank that fails before it has a communicator meets the others in
    torchrun's store (`faults.agent_store`).
    """
    global _failing
    _failing = True
    store_and_size = _store_for_exit or faults.agent_store(GRACE_SECONDS)
    if store_and_size is None or not faults.wait_for_failed_peers(*store_and_size, GRACE_SECONDS):
        faults.fail()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


__all__ = ["TorchCommunicator", "launcher_environment", "exit_after_peers"]
