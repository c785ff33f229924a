"""Choco-Gossip: compressed gossip of the change to a public copy of each model.

Koloskova, Stich, Jaggi, "Decentralized Stochastic Optimization and Gossip Algorithms with
Compressed Communication", ICML 2019. Peer i keeps its model x_i, a public copy x̂_i (what its
neighbours know of x_i) and s_i = Σ_j W[i,j] x̂_j over its closed neighbourhood (W[i,i] included).
All copies start at zero. One round, for every tensor t:

    q_i  = C(x_i − x̂_i)                         encoded once, the same payload to every neighbour
    x̂_i += q_i
    s_i  += W[i,i] q_i + Σ_{j~i} W[i,j] q_j       q_j decoded from j's payload
    x_i  += γ (s_i − x̂_i)

The sender decodes its own payload, so its x̂_i is exactly what its neighbours hold of it. In exact
arithmetic s_i = Σ_j W[i,j] x̂_j at all times, hence Σ_i (s_i − x̂_i) = 0 for a doubly stochastic W
and the average of the models is preserved; W[i,i] is taken as 1 − Σ_{j≠i} W[i,j] (what it is on
every built-in topology), so a user's W whose rows sum to one only within the validator's slack
keeps it too. With C = identity, x̂_i becomes the pre-round model and
the round is exact gossip x_i += γ Σ_j W[i,j] (x_j − x_i), whatever γ.

On a schedule (a graph W(t) per step, t the algorithm's step count) one public copy x̂_i is
wrong: a neighbour that is idle in a round misses that round's q_i and its copy of x̂_i would stay
behind for good. So the copies are kept per edge of the union graph: x̂_{i→j}, what j holds of x_i,
and x̂_{j→i}, what i holds of x_j. In a round each active edge gets its own payload:

    q_{i→j} = C(x_i − x̂_{i→j}),   x̂_{i→j} += q_{i→j},   x̂_{j→i} += q_{j→i}
    x_i += γ Σ_{j active} W(t)[i,j] (x̂_{j→i} − x̂_{i→j})

Both ends of an edge decode the same payloads, so each copy is the same bits at both ends. An
idle edge's copies stay as they are until the edge comes back, and then the next payload is the
difference to exactly what the other end still holds. Each active edge adds opposite terms at its
two ends (W(t) symmetric), so the average is preserved; with C = identity the round is exact
gossip with W(t). A peer without neighbours at step t skips the round. Static topologies keep the
node-level form above (same bits as ever).

Randomised compressors, the wire format and the required γ: see `algorithms.compressed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import torch

from ..comm.base import Tensor
from .base import ParamsLike, step_weights
from .compressed import CompressedGossip, CompressedPayloads, compressed_label

if TYPE_CHECKING:
    from ..comm.base import Comm


class ChocoIncrements(CompressedPayloads):
    """A Choco message decodes to q_j, the increment of the copy x̂_j (per edge on a schedule)
    that the receiver keeps of the sender; the copies start at zero."""

    part_kind = "increment"


class ChocoGossip(CompressedGossip):
    """Choco-Gossip with any `Compressor` (or its spelling, e.g. "topk:0.01").

    Args:
        params: tensors or `model.parameters()` / `named_parameters()`, updated in place.
        comm: a communicator (`MPICommunicator` or the one `LocalCluster.run` passes).
        compressor: a `Compressor` or a spec for `parse_compressor` ("topk:0.01", "sign", ...).
        gamma: the consensus step, required (tune it; there is no valid default).
        seed: base of the compression keys (random-k, QSGD, low rank draw from them).

    Each tensor is compressed as a whole, in its own shape (low rank views a tensor as
    shape[0] x rest). Extra memory: three model-sized buffers (x̂, s, one scratch); on a
    schedule two per union neighbour (the copies of the edge) and two scratch.
    """

    name = "choco"
    summary = (
        "Choco-Gossip: compressed gossip of x - x_hat (gamma must be tuned), "
        "e.g. compressor=topk:0.01"
    )
    layout = ChocoIncrements
    #: A membership change carries each kept edge's two copies x̂_{i→j}, x̂_{j→i} (schedule
    #: form). The static form keeps only s_i = Σ_j W[i,j] x̂_j, from which no edge's copy can be
    #: told apart: at the first change every edge's copies start again from zero, at both ends.
    supports_churn = True
    #: Muffliato and DECOR (`GossipAlgorithm.supports_update_noise`).
    supports_update_noise = True
    label = compressed_label("Choco")
    config_name = "Choco"
    example_compressor = "topk:0.01"

    def __init__(
        self,
        params: ParamsLike,
        comm: Comm,
        compressor=None,
        gamma: Optional[float] = None,
        seed: int = 0,
    ):
        super().__init__(params, comm, compressor, gamma, seed)
        self._scratch_flat, self._scratch = self._flat_state()
        if not comm.is_static:
            self._edge_state(comm.neighbors)
            return
        # W[i,i] as 1 - (the row's other weights): the average is kept only when the self weight
        # and the neighbours' weights sum to one, and a user's W may be off by the validator's
        # slack (1e-9). Summed by numpy over the whole row, as `topologies` derives its diagonals:
        # on every built-in topology this is W[i,i] to the bit.
        row = comm.topology.W[comm.rank].copy()
        row[comm.rank] = 0.0
        self._self_weight = float(1.0 - row.sum())
        self.x_hat, self._x_hat = self._flat_state()
        self.s, self._s = self._flat_state()

    def _edge_state(self, neighbors) -> None:
        """The per-edge copies of a schedule run (see the module docstring)."""
        self.x_hat_out = {j: self._flat_state() for j in neighbors}  # x̂_{i→j}: flat, views
        self.x_hat_in = {j: self._flat_state()[0] for j in neighbors}  # x̂_{j→i}
        self._edge_send = {j: torch.zeros_like(self._messages.send) for j in neighbors}
        self._mix_flat, self._mix = self._flat_state()

    def _step(self) -> None:
        if not self.comm.is_static:
            self._scheduled_step()
            return
        q = self._scratch
        # q_i = C(x_i - x̂_i), encoded once for every neighbour.
        for x, x_hat, diff in zip(self.params, self._x_hat, q):
            torch.sub(x.detach(), x_hat, out=diff)
        self._send_compressed(self._scratch_flat, q)
        self._decode_own(q)
        self.x_hat.add_(self._scratch_flat)
        self.s.add_(self._scratch_flat, alpha=self._self_weight)
        for w in self._decode_neighbors(q):
            self.s.add_(self._scratch_flat, alpha=w)
        # x_i += gamma (s_i - x̂_i)
        torch.sub(self.s, self.x_hat, out=self._scratch_flat)
        for x, update in zip(self.params, q):
            x.add_(update, alpha=self.gamma)

    def _scheduled_step(self) -> None:
        step = self.steps
        neighbors, weights = step_weights(self.comm, step)
        if not neighbors:
            return
        q, q_flat, messages, me = self._scratch, self._scratch_flat, self._messages, self.comm.rank
        for j in neighbors:
            x_hat_flat, x_hat = self.x_hat_out[j]
            for x, x_hat_t, diff in zip(self.params, x_hat, q):
                torch.sub(x.detach(), x_hat_t, out=diff)
            if not bool(torch.isfinite(q_flat).all()):
                self._raise_non_finite()
            messages.encode(q, step, me)
            self._edge_send[j].copy_(messages.send)
            messages.decode(messages.send_views, q, step, me)  # what j decodes of it
            x_hat_flat.add_(q_flat)
        self._exchange(
            {j: self._edge_send[j] for j in neighbors},
            {j: messages.recv[j] for j in neighbors},
            step,
        )
        mix = self._mix_flat.zero_()
        for j, w in zip(neighbors, self._decode_neighbors(q, neighbors, weights)):
            self.x_hat_in[j].add_(q_flat)
            mix.add_(self.x_hat_in[j], alpha=w)
            mix.add_(self.x_hat_out[j][0], alpha=-w)
        for x, update in zip(self.params, self._mix):
            x.add_(update, alpha=self.gamma)

    def edge_state(self, neighbor: int) -> Optional[Dict[str, object]]:
        if self.comm.is_static:
            return None
        return {
            "x_hat_out": self.x_hat_out[neighbor][0].clone(),
            "x_hat_in": self.x_hat_in[neighbor].clone(),
        }

    def load_edge_state(self, neighbor: int, state: Dict[str, object]) -> None:
        self.x_hat_out[neighbor][0].copy_(state["x_hat_out"])
        self.x_hat_in[neighbor].copy_(state["x_hat_in"])

    def state_buffers(self) -> Dict[str, Tensor]:
        if not self.comm.is_static:
            state = {f"x_hat_out.{j}": flat for j, (flat, _) in self.x_hat_out.items()}
            state.update({f"x_hat_in.{j}": flat for j, flat in self.x_hat_in.items()})
            return state
        return {"x_hat": self.x_hat, "s": self.s}
