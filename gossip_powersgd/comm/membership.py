"""The communicator of a run whose membership changes: a transport's, restricted to the members.

`MemberCommunicator(transport)` is what every algorithm, hook and metric of such a run talks
through. In the first membership epoch (every peer a member) it is the transport itself under
another name: the same messages, the same collectives, the same bits. After a change
(`set_epoch`) its topology is the repaired graph of the live peers (`topologies.repair`), its
exchanges go to that graph's neighbours, and its collectives (all-reduce, all-gather, the
agreement checks) run as a ring over the live peers only, in id order, so a departed peer is
never waited for. Peer ids (`rank`) never change.

Like every transport it has the three small operations of `comm.base`, here by delegation:
`_exchange` and `_sendrecv` are the transport's point-to-point operations (which reach any peer,
not only neighbours), `_allgather_tensor` is a ring of `_sendrecv` over the live peers.

`transfer` hands state to a joining peer (`membership.transfer`): point to point, through the
same `_exchange`, counted apart (`CommStats.transfer_bytes_sent`), neither training nor metric
traffic.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple

from .base import AgreementError, Communicator, Tensor, digest, nbytes, union_neighbors

if TYPE_CHECKING:
    from topologies import AnyTopology

__all__ = ["MemberCommunicator", "NO_DEADLINE", "rejoins"]

#: The wait of a peer for others that may be far behind it (a joiner's admission, the end of the
#: run): a year, the longest wait every platform's thread primitives take.
NO_DEADLINE = min(threading.TIMEOUT_MAX, 365 * 24 * 3600.0)


class MemberCommunicator(Communicator):
    """`transport` restricted to the live peers of the current membership epoch (module doc)."""

    def __init__(self, transport: Communicator):
        # No collective: the transport checked the topology when it was made.
        super().__init__(transport.topology, transport.rank, transport.timeout)
        self.transport = transport
        self.stats = transport.stats  # one set of counters for the peer
        self.live: Tuple[int, ...] = tuple(range(self.size))
        self._group: Optional[Tuple[int, ...]] = None

    def set_epoch(self, topology: AnyTopology, live: Sequence[int], number: int = 0) -> None:
        """Gossip on `topology` (a graph over all ids) with the peers `live` from now on
        (membership epoch `number`). A transport that builds a group per epoch (torch under
        on_peer_loss: continue: `comm.torch_members`) builds it now, collective over `live`."""
        self.topology = topology
        self.neighbors = union_neighbors(topology, self.rank)
        self.live = tuple(sorted(live))
        set_members = getattr(self.transport, "set_members", None)
        if set_members is not None and getattr(self.transport, "interrupted", None) is not None:
            set_members(number, self.live)

    @contextlib.contextmanager
    def over(self, members: Sequence[int]) -> Iterator[None]:
        """Run the collectives inside over `members` (ascending ids) instead of the live peers:
        the membership change's one collective that the leaving peers join too."""
        self._group = tuple(sorted(members))
        try:
            yield
        finally:
            self._group = None

    def _ring_members(self) -> Tuple[int, ...]:
        return self._group if self._group is not None else self.live

    def _everyone(self) -> bool:
        return len(self._ring_members()) == self.size

    # ---- the three small operations ------------------------------------------------------------
    def _exchange(self, send: Dict[int, Tensor], recv: Dict[int, Tensor]) -> None:
        self.transport._exchange(send, recv)

    def _sendrecv(self, dest, send: Tensor, source, recv: Tensor) -> None:
        self.transport._sendrecv(dest, send, source, recv)

    def _allgather_tensor(self, tensor: Tensor) -> List[Tensor]:
        """Every member's copy of a small tensor, in id order: the transport's own gather while
        every peer is a member, else n-1 passes around the ring of members."""
        if self._everyone():
            return self.transport._allgather_tensor(tensor)
        members = self._ring_members()
        n, r = len(members), members.index(self.rank)
        blocks = [
            tensor.detach().clone() if k == r else tensor.new_empty(tensor.shape) for k in range(n)
        ]
        right, left = members[(r + 1) % n], members[(r - 1) % n]
        for step in range(n - 1):
            self._sendrecv(right, blocks[(r - step) % n], left, blocks[(r - step - 1) % n])
        return blocks

    # ---- collectives over the members ------------------------------------------------------------
    def allgather_bytes(self, data: bytes) -> List[bytes]:
        """`Communicator.allgather_bytes` over the members: the transport's own while every peer
        is a member (torch gathers with its own collective, not `_allgather_tensor`)."""
        if self._everyone():
            return self.transport.allgather_bytes(data)
        return super().allgather_bytes(data)

    def allreduce_(self, tensor: Tensor, op: str = "mean", metric: bool = False) -> Tensor:
        """`Communicator.allreduce_` over the members: the transport's own while every peer is
        a member (the same bits as a run without membership changes)."""
        if self._everyone():
            return self.transport.allreduce_(tensor, op=op, metric=metric)
        return super().allreduce_(tensor, op=op, metric=metric)

    def check_agreement(self, what: str, value: str) -> None:
        """Raise `AgreementError` on every member unless all pass the same `value` (the
        disagreement names peer ids, not positions in the ring)."""
        digests = self.allgather_bytes(digest(value))
        if len(set(digests)) > 1:
            members = self._ring_members()
            groups: Dict[bytes, List[int]] = {}
            for peer, d in zip(members, digests):
                groups.setdefault(d, []).append(peer)
            parts = [f"peers {ids} hold variant {k + 1}" for k, ids in enumerate(groups.values())]
            raise AgreementError(f"{what} differs across peers: " + "; ".join(parts))

    def rendezvous(self) -> None:
        """Wait, without deadline, until every peer of the run (members or not) has called it."""
        timeout = self.transport.timeout
        self.transport.timeout = NO_DEADLINE
        try:
            with self.over(range(self.size)):
                self.barrier()
        finally:
            self.transport.timeout = timeout

    # ---- state for joining peers ---------------------------------------------------------------
    def transfer(
        self, send: Dict[int, Tensor], recv: Dict[int, Tensor], *, wait: bool = False
    ) -> None:
        """Send `send[j]` to each peer j and fill `recv[k]` from each peer k (any peers), counted
        as transfer traffic. `wait`: the receives have no deadline (a joining peer waits for the
        members to reach its admission step, however long they take; an abort still ends it)."""
        for k, buffer in recv.items():
            if not buffer.is_contiguous():
                raise ValueError(
                    f"rank {self.rank}: the receive buffer for peer {k} is not contiguous"
                )
        timeout = self.transport.timeout
        with self._one_at_a_time("a state transfer"):
            if wait:
                self.transport.timeout = NO_DEADLINE
            try:
                self._exchange(send, recv)
            finally:
                self.transport.timeout = timeout
        for buffer in send.values():
            self.stats.transfer_bytes_sent += nbytes(buffer)
            self.stats.transfer_messages_sent += 1


def rejoins(comm: Communicator) -> bool:
    """Whether `comm` (a `MemberCommunicator`, or a transport) is that of a process rejoining a
    running run (gossip-train --rejoin), which is no member until the members admit it."""
    return bool(getattr(getattr(comm, "transport", comm), "_rejoined", False))
