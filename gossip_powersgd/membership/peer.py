"""One peer's side of the membership: what it does when an epoch takes effect.

`PeerMembership.advance(step, state)` is called by every peer at the start of every step (members
and absent peers alike; it costs nothing between changes). When the epoch of `step` differs from
the one in force, every peer of the old or the new epoch does, in this order:

1. members of the new epoch switch their communicator to its graph and live peers;
2. joiners get their state from the survivors (`transfer.hand_over`; a joiner loads it with
   `state.unpack`);
3. with `measure_shift`, every peer of the old or the new epoch (the leaving ones too) takes part
   in one all-reduce that measures how far the change moved the members' average (`Change.shift`)
   and sums the bytes the senders handed to the joiners (`Change.transferred`: known then to every
   peer of the change, so a run's total does not lose a sender that leaves later);
4. members of the new epoch build the algorithm again and carry its state over
   (`algorithm.build_for_epoch`); leaving peers stop.

Peers in neither epoch do nothing. Every step is collective over the peers it names, and all of
them derive the same epochs, so none waits for a peer that will not come.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, Optional, Protocol, Tuple

import torch

from .algorithm import MemberAlgorithm, build_for_epoch, carried_state
from .epochs import Membership, MembershipEpoch
from .transfer import hand_over

if TYPE_CHECKING:
    from ..comm.membership import MemberCommunicator

__all__ = ["Change", "JoinState", "ParamsState", "PeerMembership"]


class JoinState(Protocol):
    """What a joining peer is handed: `pack` on a survivor, `unpack` on the joiner."""

    def pack(self) -> Dict[str, torch.Tensor]: ...

    def unpack(self, state: Dict[str, torch.Tensor]) -> None: ...


class ParamsState:
    """The simplest `JoinState`: a list of tensors (a gossip loop without a trainer)."""

    def __init__(self, tensors):
        self.tensors = list(tensors)

    def pack(self) -> Dict[str, torch.Tensor]:
        return {f"param.{k}": t for k, t in enumerate(self.tensors)}

    def unpack(self, state: Dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, t in enumerate(self.tensors):
                t.copy_(state[f"param.{k}"])


@dataclasses.dataclass(frozen=True)
class Change:
    """A membership change as one peer saw it."""

    previous: MembershipEpoch
    epoch: MembershipEpoch
    #: ||new members' average - old members' average|| of the parameters (float64), measured
    #: on every peer of either epoch; None when not measured.
    shift: Optional[float]
    #: Bytes of state every sender handed to the joiners at this change, summed over the senders
    #: (header and body, `transfer`); 0 without joiners, None when not measured.
    transferred: Optional[int] = 0

    @property
    def left(self) -> Tuple[int, ...]:
        return tuple(sorted(set(self.previous.live) - set(self.epoch.live)))

    @property
    def joined(self) -> Tuple[int, ...]:
        return tuple(sorted(set(self.epoch.live) - set(self.previous.live)))


class PeerMembership:
    """One peer's membership driver (module docstring). `comm` is its `MemberCommunicator`."""

    def __init__(
        self,
        comm: MemberCommunicator,
        membership: Membership,
        *,
        join: str = "average",
        measure_shift=True,
    ):
        self.comm = comm
        self.membership = membership
        self.join = join
        self.measure_shift = measure_shift
        self.epoch = membership.epochs[0]
        self.algorithm: Optional[MemberAlgorithm] = None
        #: Epochs of detected changes (`membership.detected`) -> the algorithm counters the
        #: survivors agreed on: such a change carries no edge state and measures no shift.
        self.detected: Dict[int, Dict[str, int]] = {}

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def live(self) -> bool:
        """Whether this peer is a member now."""
        return self.rank in self.epoch

    def bind(self, spec: str, algorithm) -> MemberAlgorithm:
        """Wrap this peer's algorithm of epoch 0 (built from `spec` on `comm`)."""
        self.algorithm = MemberAlgorithm(spec, algorithm, self.epoch.number)
        return self.algorithm

    def advance(self, step: int, state) -> Optional[Change]:
        """Apply the epoch of `step` if it is a new one (module docstring); the change, or None."""
        new = self.membership.at(step)
        old = self.epoch
        if new.number == old.number:
            return None
        if new.number != old.number + 1:
            raise RuntimeError(
                f"peer {self.rank}: advanced from membership epoch {old.number} to {new.number} "
                "at once: advance must be called at every step"
            )
        self.epoch = new
        me = self.rank
        if me not in old and me not in new:
            return Change(old, new, None)
        graph = self.membership.graph(new)
        carried = None
        detected = self.detected.get(new.number)
        if me in old and me in new:  # read before the communicator moves on
            before = set(self.membership.graph(old).union.neighbors(me))
            kept = sorted(before & set(graph.union.neighbors(me))) if detected is None else []
            carried = carried_state(self.algorithm.inner, kept)
            if detected is not None:
                carried = ({**carried[0], **detected}, carried[1])
        if me in new:
            self.comm.set_epoch(graph, new.live, new.number)
        survivors = sorted(set(old.live) & set(new.live))
        joiners = sorted(set(new.live) - set(old.live))
        received, sent = None, self.comm.stats.transfer_bytes_sent
        if me in new:
            received = hand_over(
                self.comm, me, joiners, graph, survivors, self.join, lambda: self._pack(state)
            )
            if received is not None:
                state.unpack({k: v for k, v in received.items() if not k.startswith("algorithm.")})
        sent = self.comm.stats.transfer_bytes_sent - sent
        shift, transferred = None, (None if joiners else 0)
        if self.measure_shift and detected is None:
            shift, transferred = self._measure(old, new, me in new, sent)
        if me in new:
            self._rebuild(new, carried, received)
        return Change(old, new, shift, transferred)

    def _pack(self, state) -> Dict[str, torch.Tensor]:
        packed = dict(state.pack())
        for name, value in self.algorithm.inner.node_state().items():
            if isinstance(value, int):
                packed[f"algorithm.{name}"] = torch.tensor(value, dtype=torch.int64)
        return packed

    def _measure(
        self, old: MembershipEpoch, new: MembershipEpoch, member: bool, sent: int
    ) -> Tuple[float, int]:
        """(||x̄_new - x̄_old||, the bytes every peer handed to the joiners): one float64
        all-reduce over the peers of either epoch (`sent`: this peer's bytes, < 2^53)."""
        x = torch.cat([p.detach().reshape(-1).to(torch.float64) for p in self.algorithm.params])
        was, now = float(self.rank in old), float(member)
        counts = torch.tensor([float(sent), was, now], dtype=torch.float64)
        vector = torch.cat([x * was, x * now, counts])
        with self.comm.over(set(old.live) | set(new.live)):
            self.comm.allreduce_(vector, op="sum", metric=True)
        n = x.numel()
        before, after = vector[:n] / vector[-2], vector[n : 2 * n] / vector[-1]
        return float(torch.linalg.vector_norm(after - before)), int(vector[-3])

    def _rebuild(self, new: MembershipEpoch, carried, received) -> None:
        counters = None
        if carried is None:  # a joiner: fresh state, the senders' counters
            counters = {
                k[len("algorithm.") :]: int(v)
                for k, v in (received or {}).items()
                if k.startswith("algorithm.")
            }
        algorithm = self.algorithm
        inner = build_for_epoch(
            algorithm.spec, algorithm.names, algorithm.params, self.comm, carried, counters
        )
        algorithm.replace(inner, new.number)

    def resume_at(self, step: int) -> None:
        """Put this peer in the epoch of `step` without a change (a resumed run, before its
        checkpoint is loaded): a member builds the algorithm for that epoch, fresh (collective
        over its members); the checkpoint then fills its state."""
        epoch = self.membership.at(step)
        if epoch.number == self.epoch.number:
            return
        self.epoch = epoch
        if self.rank not in epoch:
            return
        graph = self.membership.graph(epoch)
        self.comm.set_epoch(graph, epoch.live, epoch.number)
        algorithm = self.algorithm
        inner = build_for_epoch(algorithm.spec, algorithm.names, algorithm.params, self.comm)
        algorithm.replace(inner, epoch.number)
