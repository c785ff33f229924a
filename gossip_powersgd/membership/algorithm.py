"""The gossip algorithm across membership epochs: rebuilt at each change, its state carried.

At a membership change each member builds the algorithm again on the new epoch's graph (the
per-edge machinery of schedules: one state per edge of the union graph, each edge's own half-step
counter) and carries over, from the previous epoch's instance:

* its own state (`GossipAlgorithm.node_state`: the step count, PowerGossip's half-step count,
  DeepSqueeze's error memory, push-sum's weight);
* the state of every edge that stays, i.e. whose other end was a member before and after the
  change and is a neighbour in both epochs' union graphs (`edge_state`: PowerGossip's warm-start
  factors, generator and half-step counter; Choco's two public copies once in its per-edge form).

Every other edge starts fresh at both ends: a removed edge's state is dropped, a new one is made
by the constructor (PowerGossip seeds it from (seed, min(i, j), max(i, j)) of the stable peer
ids). Both ends see the same epochs, so they agree on which edges stay. A joining peer builds a
fresh algorithm and takes the counters (step and half-step counts) of the peers that hand it its
state (`membership.transfer`).

The consensus step: an algorithm whose default γ is the topology's ("topology") gets the
repaired graph's own (`topologies.Repaired.gamma`; 1 on a schedule); a γ given in the spec is
checked again against the new graph's stable range (exact gossip refuses one outside it, the
compressed algorithms warn, as at the start).

`MemberAlgorithm` is the object the trainer and the hooks hold: it forwards to the current
instance and adds up the gossip timers of every instance it had.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Union

from ..algorithms import AlgorithmSpec, parse_algorithm
from ..errors import PeerLostError

if TYPE_CHECKING:
    from ..comm.membership import MemberCommunicator

__all__ = [
    "MemberAlgorithm",
    "build_for_epoch",
    "carried_state",
    "check_every_epoch",
    "refuse_unsupported",
]


def refuse_unsupported(spec: Union[str, AlgorithmSpec]) -> None:
    """A one-line ValueError for an algorithm that cannot go on after a membership change."""
    cls = parse_algorithm(spec).cls
    if cls.supports_churn:
        return
    if cls.name in ("allreduce", "powersgd"):
        why = (
            "it averages over every peer in one collective at every step (a centralized "
            "baseline), and a lost peer breaks that collective: it stays fail-stop"
        )
    else:
        why = "it does not declare supports_churn (a node and a per-edge state to carry over)"
    raise ValueError(
        f"algorithm {str(spec)!r} cannot go on after peers leave or join: {why}; use exact, "
        "powergossip, choco, deepsqueeze or pushsum, or on_peer_loss: abort without churn"
    )


def check_every_epoch(spec: Union[str, AlgorithmSpec], membership) -> None:
    """A γ given in `spec`, checked against the graph of every epoch of `membership` (a churn
    schedule's are all known before the run): the one-line error names the change."""
    parsed = parse_algorithm(spec)
    cls, kwargs = parsed.cls, dict(parsed.kwargs)
    if kwargs.get("gamma") is None:
        return
    for epoch in membership.epochs[1:]:
        try:
            cls.check_config(kwargs, membership.graph(epoch))
        except ValueError as exc:
            raise ValueError(f"after the membership change at step {epoch.step}: {exc}") from None


def _gamma_for(cls, kwargs: dict, graph) -> dict:
    takes_gamma = "gamma" in inspect.signature(cls.__init__).parameters
    if cls.gamma_source == "topology" and takes_gamma and kwargs.get("gamma") is None:
        kwargs = dict(kwargs, gamma=float(graph.gamma) if hasattr(graph, "gamma") else 1.0)
    return kwargs


def carried_state(algorithm, kept: Sequence[int]):
    """(node state, {neighbour: edge state}) of `algorithm` for the `kept` edges: read before its
    communicator moves to the next epoch (its answers depend on the graph it was built on)."""
    edges = {}
    for j in kept:
        state = algorithm.edge_state(j)
        if state is not None:
            edges[j] = state
    return algorithm.node_state(), edges


def build_for_epoch(
    spec: Union[str, AlgorithmSpec],
    names: Sequence[str],
    params: Sequence,
    comm: MemberCommunicator,
    carried=None,
    counters: Optional[Dict[str, int]] = None,
):
    """The algorithm of `spec` on `comm`'s current graph (collective over its members), with the
    `carried` state of a member's previous instance (`carried_state`), or, for a joining peer,
    fresh state with `counters` (the senders' step counts)."""
    parsed = parse_algorithm(spec)
    cls, kwargs = parsed.cls, dict(parsed.kwargs)
    kwargs = _gamma_for(cls, kwargs, comm.topology)
    algorithm = cls(list(zip(names, params)), comm, **kwargs)
    if carried is not None:
        node, edges = carried
        algorithm.load_node_state(node)
        for j, state in edges.items():
            algorithm.load_edge_state(j, state)
    elif counters:
        algorithm.load_node_state({**algorithm.node_state(), **counters})
    return algorithm


class MemberAlgorithm:
    """The gossip algorithm of a run whose membership changes: the current epoch's instance
    (`inner`), rebuilt by the membership at each change (see the module docstring)."""

    def __init__(self, spec: str, inner, epoch: int = 0):
        self.spec = spec
        self.inner = inner
        #: The membership epoch `inner` was built for (checkpointed with its state).
        self.epoch = epoch
        self.names: List[str] = list(inner.names)
        self.params: List = list(inner.params)
        self._time_total = 0.0
        self._time_communication = 0.0
        #: steps whose gossip a lost peer interrupted (dropped)
        self.interrupted_steps = 0

    def replace(self, inner, epoch: int) -> None:
        """Make `inner` the current instance (the previous one's timers are kept)."""
        self._time_total += self.inner.time_total
        self._time_communication += self.inner.time_communication
        self.inner, self.epoch = inner, epoch

    # ---- what the loop uses ----------------------------------------------------------------------
    def step(self) -> None:
        """The current instance's step; under on_peer_loss: continue on torch, a step whose
        exchanges a lost peer interrupted is finished without them (`membership.detected`)."""
        try:
            self.inner.step()
        except PeerLostError:
            self.interrupted_steps += 1

    @property
    def acts_on(self) -> str:
        return self.inner.acts_on

    @property
    def steps(self) -> int:
        return self.inner.steps

    @property
    def time_total(self) -> float:
        return self._time_total + self.inner.time_total

    @property
    def time_communication(self) -> float:
        return self._time_communication + self.inner.time_communication

    @property
    def time_compute(self) -> float:
        return self.time_total - self.time_communication

    def bytes_per_step(self) -> int:
        return self.inner.bytes_per_step()

    def state_dict(self) -> Dict[str, object]:
        return {"membership_epoch": self.epoch, "inner": self.inner.state_dict()}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Load a `state_dict` of this run: the membership must have rebuilt `inner` for the
        saved epoch first (`membership.peer.PeerMembership.resume_at`)."""
        if int(state["membership_epoch"]) != self.epoch:
            raise ValueError(
                f"the algorithm state is for membership epoch {state['membership_epoch']}, but "
                f"this peer is in epoch {self.epoch}: the membership was not restored first"
            )
        self.inner.load_state_dict(state["inner"])

    def __getattr__(self, name: str):
        if name == "inner":  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"MemberAlgorithm(epoch={self.epoch}, {self.inner!r})"
