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
and the average of the models is preserved. With C = identity, x̂_i becomes the pre-round model and
the round is exact gossip x_i += γ Σ_j W[i,j] (x_j − x_i), whatever γ.

Randomised compressors, the wire format and the required γ: see `algorithms.compressed`.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ..comm.base import Tensor
from .base import ParamsLike
from .compressed import CompressedGossip


class ChocoGossip(CompressedGossip):
    """Choco-Gossip with any `Compressor` (or its spelling, e.g. "topk:0.01").

    Args:
        params: tensors or `model.parameters()` / `named_parameters()`, updated in place.
        comm: a communicator (`MPICommunicator` or the one `LocalCluster.run` passes).
        compressor: a `Compressor` or a spec for `parse_compressor` ("topk:0.01", "sign", ...).
        gamma: the consensus step, required (tune it; there is no valid default).
        seed: base of the compression keys (random-k, QSGD, low rank draw from them).

    Each tensor is compressed as a whole, in its own shape (low rank views a tensor as
    shape[0] x rest). Extra memory: three model-sized buffers (x̂, s, one scratch).
    """

    name = "choco"
    config_name = "Choco"
    example_compressor = "topk:0.01"

    def __init__(self, params: ParamsLike, comm, compressor=None, gamma: Optional[float] = None,
                 seed: int = 0):
        super().__init__(params, comm, compressor, gamma, seed)
        self._self_weight = comm.topology.weight(comm.rank, comm.rank)
        self.x_hat, self._x_hat = self._flat_state()
        self.s, self._s = self._flat_state()
        self._scratch_flat, self._scratch = self._flat_state()

    def _step(self) -> None:
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

    def state_buffers(self) -> Dict[str, Tensor]:
        return {"x_hat": self.x_hat, "s": self.s}
