"""Membership epochs: which peers are members of the run, from which step on.

A run's membership is a sequence of epochs ``(number, step, live)``: epoch 0 is every peer of the
topology from step 0; epoch e takes effect at the agreed step `step` (before any work of that
step, on every peer at once) and lasts until the next one. Peer ids are stable: they are the
topology's node ids 0..n-1, a peer that leaves keeps its id and gets it back when it rejoins.

Two sources fill the sequence through the same `Membership.append`: the in-process backend's
churn schedule (`membership.churn`, all epochs known before the run starts) and, on a transport
that detects lost peers, the agreed decisions of the survivors (one `append` per agreed change).
Every peer holds the same sequence, so every peer derives the same graph for every step
(`Membership.graph`: the topology itself in epoch 0, `topologies.repair` of it afterwards).
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Iterable, List, Tuple

import topologies
from topologies.repair import describe_live

if TYPE_CHECKING:
    from topologies import AnyTopology

__all__ = ["MembershipEpoch", "Membership"]

#: How many repaired graphs a `Membership` keeps built (each holds a dense n x n W).
CACHED_GRAPHS = 8


@dataclasses.dataclass(frozen=True)
class MembershipEpoch:
    """One membership: epoch `number`, in force from the start of training step `step` on, with
    the peers `live` (stable ids, ascending)."""

    number: int
    step: int
    live: Tuple[int, ...]

    def __contains__(self, peer: int) -> bool:
        return peer in self.live

    def describe(self) -> str:
        return f"epoch {self.number} (from step {self.step}): peers {describe_live(self.live)}"


class Membership:
    """The agreed sequence of membership epochs of a run on `topology` (see the module doc)."""

    def __init__(self, topology: AnyTopology, epochs: Iterable[Tuple[int, Iterable[int]]] = ()):
        self.topology = topology
        self.size = topology.size
        self._epochs: List[MembershipEpoch] = [MembershipEpoch(0, 0, tuple(range(self.size)))]
        self._steps: List[int] = [0]
        self._graphs: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        for step, live in epochs:
            self.append(step, live)

    @property
    def epochs(self) -> Tuple[MembershipEpoch, ...]:
        return tuple(self._epochs)

    @property
    def last(self) -> MembershipEpoch:
        return self._epochs[-1]

    def append(self, step: int, live: Iterable[int]) -> MembershipEpoch:
        """Add the epoch that takes effect at `step` with members `live`; a one-line ValueError
        for a step not after the last epoch's, an unknown id, no member at all, or no change."""
        live = tuple(sorted(set(int(k) for k in live)))
        last = self.last
        if int(step) <= last.step:
            raise ValueError(
                f"a membership change at step {step} does not come after the last one (step "
                f"{last.step}): changes take effect at increasing steps"
            )
        unknown = [k for k in live if not 0 <= k < self.size]
        if unknown:
            raise ValueError(
                f"peer {unknown[0]} is not a peer of {self.topology.name!r} (ids 0..{self.size - 1})"
            )
        if not live:
            raise ValueError(f"at step {step} no peer would be left: at least one must stay")
        if live == last.live:
            raise ValueError(f"the membership at step {step} is the same as before: no change")
        epoch = MembershipEpoch(last.number + 1, int(step), live)
        self.graph(epoch)  # the repair rule's own checks (connected, not directed) now
        self._epochs.append(epoch)
        self._steps.append(epoch.step)
        return epoch

    def at(self, step: int) -> MembershipEpoch:
        """The epoch in force during training step `step`."""
        return self._epochs[bisect.bisect_right(self._steps, int(step)) - 1]

    def graph(self, epoch: MembershipEpoch):
        """What the members of `epoch` gossip on: the topology itself in epoch 0, else the
        repaired graph of its live peers (a `topologies.Repaired`, a schedule over the n ids)."""
        if epoch.number == 0:
            return self.topology
        with self._lock:
            graph = self._graphs.get(epoch.live)
            if graph is not None:
                self._graphs.move_to_end(epoch.live)
                return graph
        graph = topologies.repair(self.topology, epoch.live)
        with self._lock:
            self._graphs[epoch.live] = graph
            while len(self._graphs) > CACHED_GRAPHS:
                self._graphs.popitem(last=False)
        return graph

    def absences(self, peer: int) -> List[Tuple[int, int]]:
        """(left at, back at) steps of each absence of `peer`; back at is None for the last one
        if it never returns."""
        spans, start = [], None
        for epoch in self._epochs:
            if peer not in epoch.live and start is None:
                start = epoch.step
            elif peer in epoch.live and start is not None:
                spans.append((start, epoch.step))
                start = None
        if start is not None:
            spans.append((start, None))
        return spans

    def state_dict(self) -> dict:
        """The epochs as plain values (for a checkpoint: what a detected change appended)."""
        return {"epochs": [[e.step, list(e.live)] for e in self._epochs[1:]]}

    def __repr__(self) -> str:
        return f"Membership({self.topology.name!r}, epochs={len(self._epochs)})"
