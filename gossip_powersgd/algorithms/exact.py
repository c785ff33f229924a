"""Exact (uncompressed) gossip: x_i <- x_i + gamma * sum_j W[i,j] (x_j - x_i).

On a schedule the weights of step t are W(t)'s, t being the algorithm's own step count (so a
resumed run continues on the right graph); a peer without neighbours at t leaves its model alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Sequence

import torch

from ..comm.base import Tensor
from ..specs import parse_optional_float
from . import kernels
from .base import FlatParams, GossipAlgorithm, Option, ParamsLike, require_undirected, step_weights
from .layout import WholeModel

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology


def resolve_gamma(gamma: Optional[float], comm: Comm) -> float:
    """`None` means the topology's consensus step 2/(lambda_min + lambda_max) of I - W; on a
    schedule (whose W changes every step) it means 1, plain mixing with each step's W."""
    if gamma is None:
        return check_gamma_positive(comm.topology.gamma if comm.is_static else 1.0)
    return check_gamma_positive(gamma)


#: The largest γ: the updates multiply float32 tensors by γ, and torch refuses a larger scalar
#: ("value cannot be converted to type float without overflow") in the middle of a step.
GAMMA_MAX = float(torch.finfo(torch.float32).max)


def check_gamma_positive(gamma) -> float:
    """`gamma` as a float, refused in one line unless it is > 0 (nan is not) and finite, at most
    float32's largest value (`GAMMA_MAX`)."""
    value = float(gamma)
    if not value > 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    if not value <= GAMMA_MAX:
        raise ValueError(f"gamma must be finite and at most {GAMMA_MAX:.4g} (float32), got {gamma}")
    return value


def mix_exact(
    x: Tensor, received: Sequence[Tensor], weights: Sequence[float], gamma: float, scratch: Tensor
) -> None:
    """x += gamma * sum_j w_j (x_j - x), accumulated in neighbour order (deterministic bits);
    `kernels.mix_exact`, which runs without the GIL, on lists of tensors and of floats."""
    kernels.mix_exact(x, list(received), [float(w) for w in weights], float(gamma), scratch)


class ExactGossip(GossipAlgorithm):
    """Every peer sends its whole model to each neighbour, all tensors packed in one message.

    gamma = 1 is plain mixing with W; gamma=None uses the topology's optimal step (`topology.gamma`),
    or 1 on a schedule. An explicit gamma outside the stable range (0, `topology.gamma_stable_max`)
    of a static topology is refused with `Topology.check_gamma`'s error: exact gossip would
    diverge with it. Directed topologies are refused (use push-sum).
    """

    name = "exact"
    #: With `edge_noise` set, neighbour j receives x + n_j (its own row), while this peer mixes with
    #: its own x unchanged: the network average moves by gamma sum_i sum_j W[i,j] n_{j->i}, zero
    #: when each sender's noises sum to zero with the weights W[i, j] (ZIP-DL's promise).
    supports_edge_noise = True
    #: Muffliato and DECOR (`GossipAlgorithm.supports_update_noise`).
    supports_update_noise = True
    #: Nothing per edge; the step count is the state a membership change carries.
    supports_churn = True
    summary = "uncompressed gossip, x += gamma * sum_j W_ij (x_j - x)"
    options = {
        "gamma": Option("gamma", parse_optional_float, "consensus step (default: the topology's)")
    }
    gamma_source = "topology"
    directed = False
    layout = WholeModel

    @classmethod
    def label(cls, options) -> str:
        return "exact gossip"

    @classmethod
    def check_config(cls, kwargs, topology: AnyTopology) -> None:
        """Exact gossip refuses a γ outside the topology's stable range when it is built; the same
        check runs from the config alone, so that every rank reports it before any peer starts a
        collective the others would never join."""
        if hasattr(topology, "check_gamma"):
            gamma = kwargs.get("gamma")
            if gamma is None:  # a schedule has no one optimal step: 1 (resolve_gamma)
                gamma = float(topology.gamma) if hasattr(topology, "gamma") else 1.0
            topology.check_gamma(gamma)

    def __init__(self, params: ParamsLike, comm: Comm, gamma: Optional[float] = None):
        # Checked before the collective set-up, so that every rank raises this error itself.
        require_undirected("exact gossip", comm)
        self.gamma = resolve_gamma(gamma, comm)
        if gamma is not None:  # a schedule's range holds at every one of its graphs
            comm.topology.check_gamma(self.gamma)
        super().__init__(params, comm)
        self._flat = FlatParams(self.params)
        self._recv = {j: torch.empty_like(self._flat.buffer) for j in comm.neighbors}
        self._weights = (
            [comm.topology.weight(comm.rank, j) for j in comm.neighbors] if comm.is_static else None
        )
        self._mix = torch.empty_like(self._flat.buffer)

    def _step(self) -> None:
        if self.comm.is_static:
            neighbors, weights, step = self.comm.neighbors, self._weights, None
        else:
            step = self.steps
            neighbors, weights = step_weights(self.comm, step)
        if not neighbors:
            return
        x = self._flat.pack()
        if self.edge_noise is None:
            send = {j: x for j in neighbors}
        else:  # a different noisy copy of x for each neighbour
            rows = x.unsqueeze(0).repeat(len(neighbors), 1)
            self.edge_noise(self.steps, neighbors, weights, rows)
            send = {j: rows[n] for n, j in enumerate(neighbors)}
        self._exchange(send, {j: self._recv[j] for j in neighbors}, step)
        mix_exact(x, [self._recv[j] for j in neighbors], weights, self.gamma, self._mix)
        self._flat.unpack()

    def bytes_per_step(self) -> int:
        """Bytes of the next `step()`: the whole model to each of that step's neighbours."""
        degree = len(
            self.comm.neighbors if self.comm.is_static else self.comm.neighbors_at(self.steps)
        )
        return degree * self._flat.buffer.numel() * self._flat.buffer.element_size()

    def state_dict(self) -> Dict[str, object]:
        return {"steps": self.steps, "gamma": self.gamma}
