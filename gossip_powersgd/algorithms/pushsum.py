"""Push-sum gossip on directed graphs (Kempe, Dobra, Gehrke 2003; SGP, Assran et al. 2019).

Peer i holds a value x_i and a push-sum weight w_i (1 at the start). At step t, with the
column-stochastic P(t) of the directed schedule (P[i,j]: the share of j's pair that j sends to i):

    x_i <- P[i,i] x_i + sum_{j -> i} P[i,j] x_j        w_i <- P[i,i] w_i + sum_{j -> i} P[i,j] w_j

Column sums of one keep sum_i x_i and sum_i w_i = n, so the de-biased z_i = x_i / w_i tends to
the average of the starting values although P is not doubly stochastic.

What lives in the model: the parameters hold z_i between steps, so that evaluation and the
optimizer see the de-biased model (as in SGP). A step converts z -> x = w z, mixes, and converts
back. The optimizer's update therefore moves x by w_i times the step it takes on z.

Wire: each peer sends its unscaled pair (x_i, w_i) — one message, the same to every out-neighbour,
w_i as its last element — and the receiver applies P[i,j], which it knows from the schedule; this
is the same sum as sending P[i,j] x_j, with one send buffer instead of one per out-neighbour.
Undirected topologies are accepted too: their W is doubly stochastic, w stays 1, and push-sum is
plain gossip with W.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Tuple

import torch

from topologies import Topology
from topologies.topology import EIGEN_ZERO_TOL

from ..comm.base import Tensor
from .base import FlatParams, GossipAlgorithm, ParamsLike
from .layout import MessageLayout, Part, unflatten

if TYPE_CHECKING:
    from topologies import AnyTopology

    from ..comm.base import Comm


class PushSumMessages(MessageLayout):
    """A push-sum message: the sender's x_j = w_j z_j, flattened, then w_j; its model is x_j / w_j
    (the de-biased z_j its parameters hold, up to the rounding of the division)."""

    def decode(self, message):
        tensor = message["tensor"]
        model = tensor[:-1] / tensor[-1]
        return [Part("model", list(range(len(self.shapes))), unflatten(model, self.shapes))]


def push_shares(graph, rank: int) -> Tuple[Tuple[int, ...], Tuple[int, ...], float, List[float]]:
    """(out-neighbours, in-neighbours, own share P[i,i], shares P[i,j] of the in-neighbours) of
    `rank` in a directed or undirected graph (an undirected W is its own push matrix)."""
    if graph.is_directed:
        outs, ins, matrix = graph.out_neighbors(rank), graph.in_neighbors(rank), graph.P
    else:
        outs = ins = graph.neighbors(rank)
        matrix = graph.W
    return tuple(outs), tuple(ins), float(matrix[rank, rank]), [float(matrix[rank, j]) for j in ins]


class PushSum(GossipAlgorithm):
    """Push-sum gossip of the parameters; the parameters hold the de-biased z_i = x_i / w_i.

    Args:
        params: tensors or `model.parameters()` / `named_parameters()`, updated in place.
        comm: a communicator on a `DirectedTopology`, a `DirectedSchedule`, or an undirected
            topology or schedule.

    The step t of the schedule is this algorithm's step count (kept in `state_dict`, with w_i).
    """

    name = "pushsum"
    summary = "push-sum gossip for directed graphs (column-stochastic P, de-biased model x/w)"
    options = {}
    gamma_source = "none"
    directed = True
    layout = PushSumMessages
    #: On undirected graphs (directed ones have no repair rule): the weight w_i is this peer's
    #: own (a joiner's starts at 1); nothing per edge.
    supports_churn = True

    @classmethod
    def label(cls, options) -> str:
        return "push-sum"

    @classmethod
    def check_config(cls, kwargs, topology: AnyTopology) -> None:
        """Refuse a static undirected W with the eigenvalue -1 (bipartite, no self weights, e.g.
        a weighted file ``0 1 0.5`` ... around a ring of 4): push-sum mixes with W itself, a step
        of 1 where exact gossip takes its gamma, and would swap the two halves for ever. (Built
        weights keep W[i,i] > 0; a directed P is checked by `validate_column_stochastic`.)"""
        if isinstance(topology, Topology) and topology.size > 1:
            lowest = float(topology.eigenvalues[-1])
            if lowest <= -1.0 + EIGEN_ZERO_TOL:
                raise ValueError(
                    f"push-sum mixes with W itself, and W of {topology.name!r} has the eigenvalue "
                    f"{lowest:.6g}: the models would oscillate and never reach consensus; use "
                    "algorithm exact (its gamma damps it), or weights that keep some W[i,i] > 0"
                )

    def __init__(self, params: ParamsLike, comm: Comm):
        self.check_config({}, comm.topology)  # on every rank, before any collective
        super().__init__(params, comm)
        self._flat = FlatParams(self.params)
        numel = self._flat.buffer.numel()
        # The message: x_i then w_i, in the parameters' dtype.
        self._message = torch.zeros(numel + 1, dtype=self.dtype, device=self.device)
        self._message[numel] = 1.0
        self._recv: Dict[int, Tensor] = {j: torch.empty_like(self._message) for j in comm.neighbors}
        self._mix = torch.empty_like(self._message)

    @property
    def weight(self) -> float:
        """This peer's push-sum weight w_i."""
        return float(self._message[-1])

    def _step(self) -> None:
        step = self.steps
        outs, ins, own, shares = push_shares(self.comm.topology_at(step), self.comm.rank)
        if not outs and not ins:
            return
        numel = self._flat.buffer.numel()
        x = self._message[:numel]
        x.copy_(self._flat.pack()).mul_(self._message[numel])  # x = w z
        self._exchange(
            {j: self._message for j in outs}, {j: self._recv[j] for j in ins}, step, directed=True
        )
        mix = torch.mul(self._message, own, out=self._mix)
        for j, share in zip(ins, shares):
            mix.add_(self._recv[j], alpha=share)
        self._message.copy_(mix)
        torch.div(x, self._message[numel], out=self._flat.buffer)  # z = x / w
        self._flat.unpack()

    def bytes_per_step(self) -> int:
        """Bytes of the next `step()`: the model and one weight to each out-neighbour of that step."""
        outs = self.comm.out_neighbors_at(self.steps)
        return len(outs) * self._message.numel() * self._message.element_size()

    def node_state(self) -> Dict[str, object]:
        return {"steps": self.steps, "weight": self._message[-1:].clone()}

    def load_node_state(self, state: Dict[str, object]) -> None:
        self.steps = int(state["steps"])
        if "weight" in state:
            self._message[-1:].copy_(state["weight"])

    def state_dict(self) -> Dict[str, object]:
        return {"steps": self.steps, "weight": self._message[-1:].detach().cpu().clone()}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        if "weight" not in state:
            raise ValueError("push-sum state has no 'weight': it was saved by another algorithm")
        self._message[-1:].copy_(state["weight"])
        self.steps = int(state["steps"])
