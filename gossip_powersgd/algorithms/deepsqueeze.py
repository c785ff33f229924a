"""DeepSqueeze: error-compensated compressed gossip of the models themselves.

Tang, Lian, Qiu, Yuan, Zhang, Zhang, Liu, "DeepSqueeze: Decentralization Meets Error-Compensated
Compression", 2019 (arXiv:1907.07346), Algorithm 1, gossip part (the local SGD step that precedes it
is the optimizer's). Peer i keeps an error memory δ_i (zero at the start). One round, per tensor:

    v_i  = x_i + δ_i                        error-compensated model
    c_i  = C(v_i)                           encoded once, the same payload to every neighbour
    δ_i  = v_i − c_i                        what the compression dropped, sent in later rounds
    x_i += γ Σ_j (W[i,j] − I[i,j]) c_j  =  x_i + γ Σ_{j~i} W[i,j] (c_j − c_i)

(the two forms agree because the rows of W sum to one; the code uses the second, which needs
only the neighbours' weights). The model itself is kept: only the mixing term uses the compressed
values. The sender decodes its own payload so that its c_i is bit-for-bit what its neighbours use.

Average preservation: summing the update over peers, Σ_i Σ_j (W[i,j] − I[i,j]) c_j
= Σ_j c_j (Σ_i W[i,j] − 1) = 0 because the columns of a doubly stochastic W sum to one. So
Σ_i x_i is preserved exactly (in exact arithmetic) at every round, whatever the compressor; the
error memories are not part of the invariant (Σ_i (x_i + δ_i) is *not* preserved). In floating
point the code uses, at peer i, the weights W[i,j] for the neighbours and their sum for itself; on a
symmetric W these are exactly the weights with which i's c_i reaches the other peers, so rounding
is the only source of drift.

Unlike Choco, DeepSqueeze compresses v_i ≈ x_i rather than a difference that vanishes at
consensus, so with a biased compressor the models reach a neighbourhood of consensus whose size
shrinks with γ, not exact consensus. γ must be tuned; it has no default.

On a schedule, step t (the algorithm's step count) mixes with W(t) over that step's neighbours.
DeepSqueeze keeps nothing per neighbour (only c_j of the current round is used), so an idle edge
simply contributes nothing, and average preservation holds for every step's symmetric W(t). A peer
without neighbours at step t skips the round: it compresses nothing and keeps its error memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import torch

from ..comm.base import Tensor
from .base import ParamsLike, step_weights
from .compressed import CompressedGossip, CompressedPayloads, compressed_label

if TYPE_CHECKING:
    from ..comm.base import Comm


class DeepSqueezeEstimates(CompressedPayloads):
    """A DeepSqueeze message decodes to c_j = C(x_j + δ_j), the estimate of the sender's model that
    the protocol publishes."""

    part_kind = "estimate"


class DeepSqueeze(CompressedGossip):
    """DeepSqueeze gossip with any `Compressor` (or its spelling, e.g. "sign").

    Args:
        params: tensors or `model.parameters()` / `named_parameters()`, updated in place.
        comm: a communicator.
        compressor: a `Compressor` or a spec for `parse_compressor`.
        gamma: the consensus step η of the paper, required (tune it).
        seed: base of the compression keys (same derivation as `ChocoGossip`).

    Extra memory: four model-sized buffers (δ, v, c, the mixing sum).
    """

    name = "deepsqueeze"
    summary = (
        "DeepSqueeze: error-compensated compressed gossip (gamma must be tuned), "
        "e.g. compressor=sign"
    )
    layout = DeepSqueezeEstimates
    #: Nothing per edge; the error memory is this peer's own (a joiner's starts at zero).
    supports_churn = True
    label = compressed_label("DeepSqueeze")
    config_name = "DeepSqueeze"
    example_compressor = "sign"

    def __init__(
        self,
        params: ParamsLike,
        comm: Comm,
        compressor=None,
        gamma: Optional[float] = None,
        seed: int = 0,
    ):
        super().__init__(params, comm, compressor, gamma, seed)
        # 1 - W[i,i], as the neighbours' weights sum (per step on a schedule)
        self._out_weight = sum(self._weights) if self._weights is not None else None
        self.error, self._error = self._flat_state()
        self._v_flat, self._v = self._flat_state()
        self._c_flat, self._c = self._flat_state()
        self._mix_flat, self._mix = self._flat_state()

    def _step(self) -> None:
        if self.comm.is_static:
            step, neighbors, weights, out_weight = None, None, None, self._out_weight
        else:
            step = self.steps
            neighbors, weights = step_weights(self.comm, step)
            out_weight = sum(weights)
            if not neighbors:
                return
        # v_i = x_i + δ_i, compressed once for every neighbour
        for x, error, v in zip(self.params, self._error, self._v):
            torch.add(x.detach(), error, out=v)
        self._send_compressed(self._v_flat, self._v, neighbors, step)
        # c_i = C(v_i) as the neighbours decode it; δ_i = v_i - c_i
        self._decode_own(self._c)
        torch.sub(self._v_flat, self._c_flat, out=self.error)
        # x_i += gamma * (sum_j W_ij c_j - (sum_j W_ij) c_i), neighbours in order; v is scratch now
        mix = self._mix_flat.zero_()
        for w in self._decode_neighbors(self._v, neighbors, weights):
            mix.add_(self._v_flat, alpha=w)
        mix.add_(self._c_flat, alpha=-out_weight)
        for x, update in zip(self.params, self._mix):
            x.add_(update, alpha=self.gamma)

    def node_state(self) -> Dict[str, object]:
        return {"steps": self.steps, "error": self.error.clone()}

    def load_node_state(self, state: Dict[str, object]) -> None:
        self.steps = int(state["steps"])
        if "error" in state:
            self.error.copy_(state["error"])

    def state_buffers(self) -> Dict[str, Tensor]:
        return {"error": self.error}
