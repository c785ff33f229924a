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

Randomised compressors (random-k, QSGD, low rank) take a `key`: the key of tensor t in round k from
sender i is derived from (seed, k, i, t) alone, so every receiver decodes with the sender's key.

The payload is a uint8 buffer holding every tensor's encoding back to back (offsets from
`Compressor.nbytes`, fixed for the run), preallocated once, as are all receive buffers and state.
γ must be tuned per compressor and topology: the topology's optimal γ for exact gossip does not
apply, so `gamma` has no default.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..comm.base import Tensor
from ..compressors import Compressor, parse_compressor
from .base import GossipAlgorithm, ParamsLike

_INT63 = 0x7FFF_FFFF_FFFF_FFFF


def compression_keys(seed: int, step: int, sender: int, count: int) -> List[int]:
    """The `count` compression keys (non-negative int63) of `sender`'s tensors in round `step`.

    Key t depends on (seed, step, sender, t) only, so a receiver derives the sender's keys itself.
    """
    state = np.random.SeedSequence([seed, step, sender]).generate_state(max(count, 1), dtype=np.uint64)
    return [int(v) & _INT63 for v in state[:count]]


def require_tuned_gamma(gamma: Optional[float], who: str, spelling: str) -> float:
    """Compressed gossip has no default step: refuse None (and anything not > 0) with a hint."""
    if gamma is None:
        raise ValueError(
            f"{who} needs a tuned consensus step gamma: the topology's gamma is the step of exact "
            f"gossip and is not valid for compressed gossip (it may diverge). Tune it for your "
            f"compressor and topology, e.g. {spelling}"
        )
    value = float(gamma)
    if not value > 0:
        raise ValueError(f"{who}: gamma must be > 0, got {gamma}")
    return value


def check_seed(seed) -> int:
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def compressed_gossip_arguments(who: str, spelling: str, example: str, compressor, gamma,
                                seed) -> Tuple[Compressor, float, int]:
    """Check what every compressed-gossip algorithm needs: a compressor, a tuned gamma, a seed."""
    if compressor is None:
        raise ValueError(f"{who} needs a compressor, e.g. compressor='{example}' "
                         f"(spelling: {spelling}:compressor={example},gamma=0.1)")
    compressor = parse_compressor(compressor)
    gamma = require_tuned_gamma(gamma, who, f"{spelling}:compressor={compressor!r},gamma=0.1")
    return compressor, gamma, check_seed(seed)


class CompressedMessages:
    """Preallocated payload buffers for sending every tensor compressed, in one message.

    `send` is one uint8 buffer (all tensors' payloads back to back); `recv[j]` is the same layout
    for neighbour j. `encode` fills `send` from a list of tensors, `decode` reads any payload into a
    list of tensors, both with the keys of a given sender and round.
    """

    def __init__(self, compressor: Compressor, shapes: Sequence[torch.Size], dtype: torch.dtype,
                 device: torch.device, neighbors: Sequence[int], seed: int):
        self.compressor = compressor
        self.seed = seed
        self.offsets: List[int] = [0]
        for shape in shapes:
            self.offsets.append(self.offsets[-1] + compressor.nbytes(shape, dtype))
        self.nbytes = self.offsets[-1]
        new = lambda: torch.zeros(self.nbytes, dtype=torch.uint8, device=device)  # noqa: E731
        self.send = new()
        self.recv: Dict[int, Tensor] = {j: new() for j in neighbors}
        self.send_views = self._views(self.send)
        self.recv_views = {j: self._views(buffer) for j, buffer in self.recv.items()}

    def _views(self, buffer: Tensor) -> List[Tensor]:
        return [buffer[a:b] for a, b in zip(self.offsets, self.offsets[1:])]

    def keys(self, step: int, sender: int) -> List[int]:
        return compression_keys(self.seed, step, sender, len(self.offsets) - 1)

    def encode(self, tensors: Sequence[Tensor], step: int, sender: int) -> None:
        for x, out, key in zip(tensors, self.send_views, self.keys(step, sender)):
            self.compressor.encode(x, out, key)

    def decode(self, payloads: Sequence[Tensor], outs: Sequence[Tensor], step: int, sender: int) -> None:
        for payload, out, key in zip(payloads, outs, self.keys(step, sender)):
            self.compressor.decode(payload, out, key)


def flat_state(tensors: Sequence[Tensor], dtype, device):
    """A zero flat buffer the size of `tensors` and views of it shaped like each of them."""
    total = sum(t.numel() for t in tensors)
    flat = torch.zeros(total, dtype=dtype, device=device)
    views, offset = [], 0
    for t in tensors:
        views.append(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()
    return flat, views


class ChocoGossip(GossipAlgorithm):
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

    def __init__(self, params: ParamsLike, comm, compressor=None, gamma: Optional[float] = None,
                 seed: int = 0):
        super().__init__(params, comm)
        self.compressor, self.gamma, self.seed = compressed_gossip_arguments(
            "ChocoGossip", "choco", "topk:0.01", compressor, gamma, seed)
        me, neighbors = comm.rank, comm.neighbors
        self._self_weight = comm.topology.weight(me, me)
        self._weights = [comm.topology.weight(me, j) for j in neighbors]
        self.x_hat, self._x_hat = flat_state(self.params, self.dtype, self.device)
        self.s, self._s = flat_state(self.params, self.dtype, self.device)
        self._scratch_flat, self._scratch = flat_state(self.params, self.dtype, self.device)
        self._messages = CompressedMessages(self.compressor, [t.shape for t in self.params],
                                            self.dtype, self.device, neighbors, self.seed)
        comm.check_agreement("Choco configuration", f"{self.compressor!r};{self.gamma!r};{self.seed}")

    def _step(self) -> None:
        me, neighbors, k = self.comm.rank, self.comm.neighbors, self.steps
        messages, q = self._messages, self._scratch
        # q_i = C(x_i - x̂_i), encoded once for every neighbour.
        for x, x_hat, diff in zip(self.params, self._x_hat, q):
            torch.sub(x.detach(), x_hat, out=diff)
        if not bool(torch.isfinite(self._scratch_flat).all()):
            self._raise_non_finite()
        messages.encode(q, k, me)
        self._exchange({j: messages.send for j in neighbors}, messages.recv)
        # Decode our own payload: exactly what the neighbours decode of it.
        messages.decode(messages.send_views, q, k, me)
        self.x_hat.add_(self._scratch_flat)
        self.s.add_(self._scratch_flat, alpha=self._self_weight)
        for j, w in zip(neighbors, self._weights):
            messages.decode(messages.recv_views[j], q, k, j)
            self.s.add_(self._scratch_flat, alpha=w)
        # x_i += gamma (s_i - x̂_i)
        torch.sub(self.s, self.x_hat, out=self._scratch_flat)
        for x, update in zip(self.params, q):
            x.add_(update, alpha=self.gamma)

    def bytes_per_step(self) -> int:
        return len(self.comm.neighbors) * self._messages.nbytes

    @property
    def payload_bytes(self) -> int:
        """Bytes of one message (all tensors' payloads)."""
        return self._messages.nbytes

    def state_dict(self) -> Dict[str, object]:
        return {"steps": self.steps, "gamma": self.gamma, "seed": self.seed,
                "compressor": repr(self.compressor),
                "x_hat": self.x_hat.detach().cpu().clone(), "s": self.s.detach().cpu().clone()}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        _check_saved_config(self, state, "ChocoGossip")
        for key, buffer in (("x_hat", self.x_hat), ("s", self.s)):
            _load_buffer(state, key, buffer, "ChocoGossip")
        self.steps = int(state["steps"])


def _check_saved_config(algorithm, state: Dict[str, object], who: str) -> None:
    saved = (state.get("compressor"), int(state.get("seed", -1)))
    mine = (repr(algorithm.compressor), algorithm.seed)
    if saved != mine:
        raise ValueError(f"{who} state is for compressor={saved[0]}, seed={saved[1]}; this instance "
                         f"has compressor={mine[0]}, seed={mine[1]}")


def _load_buffer(state: Dict[str, object], key: str, buffer: Tensor, who: str) -> None:
    if key not in state:
        raise ValueError(f"{who} state has no {key!r}")
    saved = state[key]
    if tuple(saved.shape) != tuple(buffer.shape):
        raise ValueError(f"{who} state {key!r} has {saved.numel()} entries, expected {buffer.numel()} "
                         "(was it saved for another model?)")
    buffer.copy_(saved)
