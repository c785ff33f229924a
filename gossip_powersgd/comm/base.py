"""The communicator interface shared by the MPI and the in-process transports.

A communicator knows the topology, its own rank and its neighbours, and moves raw tensor bytes. It
is the only place in the package that counts bytes: every algorithm goes through `exchange` (one
message to each neighbour, one from each) or `allreduce_`, and `stats` is what the results report.

Traffic is split in two: *training* traffic (what an algorithm needs to train) and *metric* traffic
(monitoring all-reduces such as the consensus distance or the averaged-model evaluation). Only the
former is the cost of an algorithm.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
from typing import (
    TYPE_CHECKING,
    Dict,
    Iterator,
    List,
    Sequence,
    Tuple,
)

import torch

from ..errors import AgreementError, CommunicationError, PeerAborted  # noqa: F401 (re-exported)
from ..utils import format_ranks
from .dtypes import CODE_DTYPES, DTYPE_CODES, dtype_code  # noqa: F401 (re-exported)
from .protocol import Comm, CommStats  # noqa: F401 (re-exported: every `comm` is annotated `Comm`)
from .reduce import (  # noqa: F401 (re-exported)
    REDUCE_OPS,
    _combine_,
    check_reducible,
    reduce_in_rank_order,
)

if TYPE_CHECKING:
    from topologies import Topology

Tensor = torch.Tensor

#: Default seconds a peer waits for a neighbour's message before it gives up naming that neighbour.
DEFAULT_TIMEOUT = 120.0


def nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def ring_chunks(numel: int, size: int) -> List[Tuple[int, int]]:
    """The (start, stop) of each peer's chunk of a flat tensor in the ring all-reduce.

    Chunk sizes differ by at most one element; the extra elements are spread evenly around the ring
    (chunk c has one more when floor((c+1) r / n) > floor(c r / n), r = numel mod n) rather than
    given to the first chunks, so that every peer sends the same number of bytes whenever that is
    possible at all (when n divides 2 numel), and otherwise within one element.
    """
    base, extra = divmod(numel, size)
    bounds, start = [], 0
    for c in range(size):
        stop = start + base + ((c + 1) * extra // size - c * extra // size)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_allreduce_bytes(numel: int, element_size: int, size: int, rank: int) -> int:
    """Bytes `rank` sends in a ring all-reduce of `numel` elements over `size` peers.

    Rank r sends every chunk but chunk r+1 in the reduce-scatter and every chunk but chunk r+2 in
    the all-gather (see `Communicator.allreduce_`): in total 2(n-1)/n x the tensor, to the element.
    """
    if size <= 1:
        return 0
    chunks = ring_chunks(numel, size)
    skipped = [chunks[(rank + 1) % size], chunks[(rank + 2) % size]]
    return (2 * numel - sum(stop - start for start, stop in skipped)) * element_size


def checked_timeout(timeout: float | None) -> float:
    """`timeout` in seconds (None: `DEFAULT_TIMEOUT`), refused unless positive and finite: a NaN
    deadline is never passed, so a wait for a silent peer hung for ever instead of timing out."""
    seconds = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not 0 < seconds < math.inf:
        raise ValueError(
            f"bad timeout {timeout!r}: it must be a positive, finite number of seconds "
            f"(the default is {DEFAULT_TIMEOUT:g})"
        )
    return seconds


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def describe_disagreement(what: str, digests: List[bytes]) -> str:
    """One line naming which ranks hold which variant."""
    groups: Dict[bytes, List[int]] = {}
    for rank, d in enumerate(digests):
        groups.setdefault(d, []).append(rank)
    variants = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks))
    parts = [f"ranks {format_ranks(r)} hold variant {k + 1}" for k, r in enumerate(variants)]
    return f"{what} differs across ranks: " + "; ".join(parts)


def as_topology(topology: Topology, who: str):
    """`topology` itself, or the graph a spec string such as "ring:4" names.

    Accepted: a static `Topology`, an undirected `Schedule`, a `DirectedTopology` or a
    `DirectedSchedule` (anything with `at(t)`, `union`, `size` and `fingerprint`).
    """
    import topologies

    if isinstance(topology, str):
        return topologies.parse(topology)
    kinds = (
        topologies.Topology,
        topologies.Schedule,
        topologies.DirectedTopology,
        topologies.DirectedSchedule,
    )
    if not isinstance(topology, kinds):
        raise TypeError(
            f"{who} needs a topologies.Topology, Schedule, DirectedTopology or "
            f"DirectedSchedule, or a spec string such as 'ring:4', "
            f"got {type(topology).__name__}"
        )
    return topology


def union_neighbors(topology: Topology, rank: int) -> Tuple[int, ...]:
    """Every peer `rank` talks to at some step, sorted: in either direction for a directed graph."""
    union = topology.union
    if topology.is_directed:
        return tuple(sorted(set(union.out_neighbors(rank)) | set(union.in_neighbors(rank))))
    return tuple(union.neighbors(rank))


class Communicator:
    """What algorithms see of a transport. Subclasses implement the `_raw` methods."""

    rank: int
    size: int
    topology: "object"
    timeout: float

    def __init__(self, topology: "Topology", rank: int, timeout: float | None):
        self.topology = topology
        self.rank = rank
        self.size = topology.size
        #: The union graph's neighbours (a static topology's neighbours); a step's are `neighbors_at`.
        self.neighbors = union_neighbors(topology, rank)
        self.timeout = checked_timeout(timeout)
        self.stats = CommStats()
        # One operation at a time: two threads stepping algorithms on one communicator would pair
        # one algorithm's message with the other's whenever their shapes agree. Caught, not queued.
        self._busy = threading.Lock()

    @contextlib.contextmanager
    def _one_at_a_time(self, what: str) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise CommunicationError(
                f"rank {self.rank}: {what} started on a communicator that is already in the middle "
                "of an exchange or collective (two threads using one communicator?); step the "
                "algorithms one after the other, or give each thread its own communicator"
            )
        try:
            yield
        finally:
            self._busy.release()

    # ---- the graph of a step -------------------------------------------------------------------
    # Rule: the communicator keeps no step counter. An algorithm passes its own step count t (kept
    # in its state_dict, so a resumed run continues at the right t) and every peer, counting the
    # same steps, derives the same graph from the schedule without talking.

    @property
    def is_static(self) -> bool:
        """True for a static undirected `Topology` (the same graph and W at every step)."""
        import topologies

        return isinstance(self.topology, topologies.Topology)

    @property
    def is_directed(self) -> bool:
        """True for a `DirectedTopology` or `DirectedSchedule` (push-sum graphs)."""
        return bool(self.topology.is_directed)

    def topology_at(self, step: int):
        """The graph of step `step`: a `Topology` (or `DirectedTopology` for a directed schedule)."""
        return self.topology.at(step)

    def neighbors_at(self, step: int) -> Tuple[int, ...]:
        """This peer's neighbours at step `step` (undirected graphs; see `out_neighbors_at`)."""
        if self.is_directed:
            raise ValueError(
                f"rank {self.rank}: the topology {self.topology.name!r} is directed; "
                "use out_neighbors_at / in_neighbors_at"
            )
        return tuple(self.topology.at(step).neighbors(self.rank))

    def out_neighbors_at(self, step: int) -> Tuple[int, ...]:
        """Peers this peer sends to at step `step` (its neighbours, on an undirected graph)."""
        graph = self.topology.at(step)
        return tuple(
            graph.out_neighbors(self.rank) if graph.is_directed else graph.neighbors(self.rank)
        )

    def in_neighbors_at(self, step: int) -> Tuple[int, ...]:
        """Peers this peer receives from at step `step` (its neighbours, on an undirected graph)."""
        graph = self.topology.at(step)
        return tuple(
            graph.in_neighbors(self.rank) if graph.is_directed else graph.neighbors(self.rank)
        )

    # ---- point to point ------------------------------------------------------------------------
    def exchange(
        self, send: Dict[int, Tensor], recv: Dict[int, Tensor], step: int | None = None
    ) -> None:
        """Send `send[j]` to every neighbour j and fill `recv[j]` in place with j's message.

        Both dicts must have exactly the neighbours as keys: the static (union) neighbours when
        `step` is None, else the neighbours of that step (`neighbors_at(step)`); a step in which
        this peer has no neighbour is no exchange at all (nothing sent, no round counted). The
        receive buffers are preallocated by the caller: a message whose byte size or dtype differs
        raises `CommunicationError` naming the sending peer; a buffer of a dtype that no transport
        carries (`comm.dtypes`) raises `ValueError` before anything is sent. Returns when every
        message has been received and every send has completed. A communicator carries one
        exchange or collective at a time: one started from another thread while the first is in
        flight raises `CommunicationError`.
        """
        expected = self.neighbors if step is None else self.neighbors_at(step)
        if not expected:
            return
        if set(send) != set(expected) or set(recv) != set(expected):
            raise ValueError(
                f"rank {self.rank}: exchange needs one send and one receive buffer per neighbour "
                f"{sorted(expected)}, got send {sorted(send)} and recv {sorted(recv)}"
            )
        self._transfer_counted({j: send[j] for j in expected}, {j: recv[j] for j in expected})

    def exchange_directed(
        self, send: Dict[int, Tensor], recv: Dict[int, Tensor], step: int
    ) -> None:
        """Send `send[j]` to every out-neighbour j of step `step` and fill `recv[k]` from every
        in-neighbour k (push-sum's transport). Keys must be exactly `out_neighbors_at(step)` and
        `in_neighbors_at(step)`; checks, counting and threading rules are `exchange`'s."""
        outs, ins = self.out_neighbors_at(step), self.in_neighbors_at(step)
        if not outs and not ins:
            return
        if set(send) != set(outs) or set(recv) != set(ins):
            raise ValueError(
                f"rank {self.rank}: a directed exchange at step {step} needs send buffers for the "
                f"out-neighbours {list(outs)} and receive buffers for the in-neighbours {list(ins)}, "
                f"got send {sorted(send)} and recv {sorted(recv)}"
            )
        self._transfer_counted({j: send[j] for j in outs}, {k: recv[k] for k in ins})

    def _transfer_counted(self, send: Dict[int, Tensor], recv: Dict[int, Tensor]) -> None:
        for j, buffer in send.items():
            dtype_code(buffer.dtype, self.rank, f"the message for peer {j}")
        for j, buffer in recv.items():
            dtype_code(buffer.dtype, self.rank, f"the receive buffer for peer {j}")
            if not buffer.is_contiguous():
                raise ValueError(
                    f"rank {self.rank}: the receive buffer for peer {j} is not contiguous"
                )
        with self._one_at_a_time("an exchange"):
            self._exchange(send, recv)
        for buffer in send.values():
            self.stats.bytes_sent += nbytes(buffer)
            self.stats.messages_sent += 1
        self.stats.rounds += 1
        self.stats.critical_bytes += max((nbytes(buffer) for buffer in send.values()), default=0)

    def _exchange(self, send: Dict[int, Tensor], recv: Dict[int, Tensor]) -> None:
        """Send `send[j]` to each of its keys and receive `recv[k]` from each of its keys (the key
        sets differ on a directed graph); every peer it names posts the matching operation."""
        raise NotImplementedError

    def _check_message(self, source: int, got_bytes: int, got_dtype, buffer: Tensor) -> None:
        want = nbytes(buffer)
        if got_dtype != buffer.dtype:
            raise CommunicationError(
                f"rank {self.rank}: message from peer {source} has dtype {got_dtype}, expected "
                f"{buffer.dtype} (do both peers run the same algorithm on the same model?)"
            )
        if got_bytes != want:
            raise CommunicationError(
                f"rank {self.rank}: message from peer {source} has {got_bytes} bytes, expected "
                f"{want} (do both peers run the same algorithm on the same model?)"
            )

    # ---- collectives ---------------------------------------------------------------------------
    def allreduce_(self, tensor: Tensor, op: str = "mean", metric: bool = False) -> Tensor:
        """All-reduce `tensor` in place over all peers and return it.

        A ring all-reduce over all ranks (not the gossip topology): the flat tensor is cut into n
        chunks (`ring_chunks`); in n-1 reduce-scatter steps rank r sends one chunk to rank r+1 and
        combines the one it gets from rank r-1, so chunk c accumulates ranks c, c+1, ..., c-1 in
        that order; "mean" then divides the finished chunk by n; n-1 all-gather steps copy the
        finished chunks around. The order of operations is fixed by numel and n alone, so every
        peer ends with the same bits and every transport computes the same bits. Each peer sends
        2(n-1)/n x the tensor's bytes (`ring_allreduce_bytes`), in 2(n-1) messages (fewer when the
        tensor has fewer elements than there are peers: empty chunks do not travel), and that is
        what is charged: to the training counters, or with `metric=True` to the metric counters.
        """
        check_reducible(tensor, op, self.rank)
        members = len(self._ring_members())
        if members == 1:
            return tensor  # the reduction of one value is itself, for every op
        with self._one_at_a_time("an all-reduce"):
            sent, messages = self._ring_allreduce(tensor, op)
        if metric:
            self.stats.metric_bytes_sent += sent
            self.stats.metric_messages_sent += messages
        else:
            self.stats.bytes_sent += sent
            self.stats.messages_sent += messages
            self.stats.rounds += 2 * (members - 1)
            self.stats.critical_bytes += sent
        return tensor

    def _ring_members(self) -> Sequence[int]:
        """The ranks the collectives run over, in ring order: every rank (a membership's
        communicator, `comm.membership`, runs them over its live peers only)."""
        return range(self.size)

    #: The reduce op of the ring all-reduce in flight (None outside one): its messages carry it
    #: (an MPI tag, a local message's envelope), so that a peer reducing with another op is an
    #: error naming it (`_check_op`), as torch's header makes it, not a silently mixed result.
    _ring_op: str | None = None

    def _check_op(self, source: int, got_op: str | None, want_op: str | None) -> None:
        if got_op != want_op:
            raise CommunicationError(
                f"rank {self.rank}: all-reduce with op {want_op!r} here, but peer {source} "
                f"reduces with {got_op!r} (do all peers run the same algorithm on the same model?)"
            )

    def _ring_allreduce(self, tensor: Tensor, op: str) -> Tuple[int, int]:
        """The ring described in `allreduce_` (over `_ring_members`, positions for ranks);
        returns (bytes sent, messages sent)."""
        self._ring_op = op
        try:
            return self._ring_steps(tensor, op)
        finally:
            self._ring_op = None

    def _ring_steps(self, tensor: Tensor, op: str) -> Tuple[int, int]:
        members = self._ring_members()
        n, r = len(members), members.index(self.rank)
        work = tensor.detach()
        flat = work.view(-1) if work.is_contiguous() else work.reshape(-1).clone()
        chunks = [flat[start:stop] for start, stop in ring_chunks(flat.numel(), n)]
        incoming = torch.empty(max(c.numel() for c in chunks), dtype=flat.dtype, device=flat.device)
        right, left = members[(r + 1) % n], members[(r - 1) % n]
        sent = messages = 0
        for phase in ("reduce-scatter", "all-gather"):
            for step in range(n - 1):
                if phase == "reduce-scatter":
                    out_chunk, in_chunk = chunks[(r - step) % n], chunks[(r - step - 1) % n]
                    landing = incoming[: in_chunk.numel()]
                else:
                    out_chunk, in_chunk = chunks[(r + 1 - step) % n], chunks[(r - step) % n]
                    landing = in_chunk
                # Both ends know every chunk's size, so empty chunks are skipped on both ends.
                self._sendrecv(
                    right if out_chunk.numel() else None,
                    out_chunk,
                    left if in_chunk.numel() else None,
                    landing,
                )
                if out_chunk.numel():
                    sent += nbytes(out_chunk)
                    messages += 1
                if phase == "reduce-scatter":
                    _combine_(in_chunk, landing, op)
            if phase == "reduce-scatter" and op == "mean":
                chunks[(r + 1) % n].div_(n)  # the chunk this rank finished
        if not work.is_contiguous():
            work.copy_(flat.view(work.shape))
        return sent, messages

    def _sendrecv(self, dest, send: Tensor, source, recv: Tensor) -> None:
        """Send `send` to rank `dest` and fill `recv` from rank `source` (any ranks, not only
        neighbours); either side may be None for nothing to send or receive. The message is
        checked for size and dtype like an `exchange`'s."""
        raise NotImplementedError

    def _allgather_tensor(self, tensor: Tensor) -> List[Tensor]:
        """Every peer's copy of a small tensor, by rank (control data only: n x the tensor moves)."""
        raise NotImplementedError

    def allgather_bytes(self, data: bytes) -> List[bytes]:
        """Gather a short byte string of the same length from every peer (control traffic)."""
        with self._one_at_a_time("an all-gather"):
            gathered = self._allgather_tensor(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return [bytes(t.numpy().tobytes()) for t in gathered]

    def barrier(self) -> None:
        self.allgather_bytes(b"\0")

    def check_agreement(self, what: str, value: str) -> None:
        """Raise `AgreementError` on every rank unless all ranks pass the same `value`."""
        digests = self.allgather_bytes(digest(value))
        if len(set(digests)) > 1:
            raise AgreementError(describe_disagreement(what, digests))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rank={self.rank}, size={self.size}, neighbors={self.neighbors})"
        )
