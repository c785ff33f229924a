"""What compressed gossip (Choco-SGD, DeepSqueeze) shares: its arguments, its wire, its state.

Each round a peer compresses one list of model-shaped tensors with a `Compressor`, sends the same
payload to every neighbour, and decodes its own and its neighbours' payloads; only what it does with
the decoded tensors (its update rule) differs between algorithms.

Both update rules need a contractive compressor. An unbiased one (QSGD, scaled random-k) is not
contractive when its variance bound ω exceeds about 1 — Choco and DeepSqueeze with `qsgd:2` then
diverge at every γ — so every decoded tensor is divided by τ = 1 + ω
(`Compressor.contraction_scale`, per tensor size), the standard rescaling of Koloskova et al. 2019.
The division happens after decoding, identically at the sender (decoding its own payload) and at
its receivers, so x̂ and c stay the same at both ends and nothing extra is sent.

Randomised compressors (random-k, QSGD, low rank) take a `key`: the key of tensor t in round k from
sender i is derived from (seed, k, i, t) alone, so every receiver decodes with the sender's key.

The payload is a uint8 buffer holding every tensor's encoding back to back (offsets from
`Compressor.nbytes`, fixed for the run), preallocated once, as are all receive buffers and state.
γ must be tuned per compressor and topology: the topology's optimal γ for exact gossip does not
apply, so `gamma` has no default. A γ outside exact gossip's stable range draws a warning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..comm.base import Tensor
from ..compressors import Compressor, parse_compressor
from ..specs import check_seed, parse_optional_float, parse_seed
from .base import GossipAlgorithm, Option, ParamsLike, require_undirected, warn_if_unstable_gamma
from .exact import check_gamma_positive
from .layout import MessageLayout, Part

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology

_INT63 = 0x7FFF_FFFF_FFFF_FFFF


def compression_keys(seed: int, step: int, sender: int, count: int) -> List[int]:
    """The `count` compression keys (non-negative int63) of `sender`'s tensors in round `step`.

    Key t depends on (seed, step, sender, t) only, so a receiver derives the sender's keys itself.
    """
    state = np.random.SeedSequence([seed, step, sender]).generate_state(
        max(count, 1), dtype=np.uint64
    )
    return [int(v) & _INT63 for v in state[:count]]


def require_tuned_gamma(gamma: Optional[float], who: str, spelling: str) -> float:
    """Compressed gossip has no default step: refuse None with a hint, and what
    `exact.check_gamma_positive` refuses (not > 0, infinite, above float32's largest)."""
    if gamma is None:
        raise ValueError(
            f"{who} needs a tuned consensus step gamma: the topology's gamma is the step of exact "
            f"gossip and is not valid for compressed gossip (it may diverge). Tune it for your "
            f"compressor and topology, e.g. {spelling}"
        )
    try:
        return check_gamma_positive(gamma)
    except ValueError as exc:
        raise ValueError(f"{who}: {exc}") from None


def compressed_gossip_arguments(
    who: str, spelling: str, example: str, compressor, gamma, seed
) -> Tuple[Compressor, float, int]:
    """Check what every compressed-gossip algorithm needs: a compressor, a tuned gamma, a seed."""
    if compressor is None:
        raise ValueError(
            f"{who} needs a compressor, e.g. compressor='{example}' "
            f"(spelling: {spelling}:compressor={example},gamma=0.1)"
        )
    compressor = parse_compressor(compressor)
    gamma = require_tuned_gamma(gamma, who, f"{spelling}:compressor={compressor!r},gamma=0.1")
    return compressor, gamma, check_seed(seed)


class CompressedMessages:
    """Preallocated payload buffers for sending every tensor compressed, in one message.

    `send` is one uint8 buffer (all tensors' payloads back to back); `recv[j]` is the same layout
    for neighbour j. `encode` fills `send` from a list of tensors, `decode` reads any payload into a
    list of tensors, both with the keys of a given sender and round, then divides each tensor by
    its `Compressor.contraction_scale` (so an unbiased compressor's output becomes contractive).
    """

    def __init__(
        self,
        compressor: Compressor,
        shapes: Sequence[torch.Size],
        dtype: torch.dtype,
        device: torch.device,
        neighbors: Sequence[int],
        seed: int,
    ):
        self.compressor = compressor
        self.seed = seed
        self.offsets: List[int] = [0]
        for shape in shapes:
            self.offsets.append(self.offsets[-1] + compressor.nbytes(shape, dtype))
        #: τ of each tensor: decoded values are divided by it (1 for contractive compressors).
        self.scales = [compressor.contraction_scale(torch.Size(shape).numel()) for shape in shapes]
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

    def decode(
        self, payloads: Sequence[Tensor], outs: Sequence[Tensor], step: int, sender: int
    ) -> None:
        for payload, out, key, scale in zip(payloads, outs, self.keys(step, sender), self.scales):
            self.compressor.decode(payload, out, key)
            if scale != 1.0:
                out.div_(scale)


def flat_state(tensors: Sequence[Tensor], dtype, device):
    """A zero flat buffer the size of `tensors` and views of it shaped like each of them."""
    total = sum(t.numel() for t in tensors)
    flat = torch.zeros(total, dtype=dtype, device=device)
    views, offset = [], 0
    for t in tensors:
        views.append(flat[offset : offset + t.numel()].view(t.shape))
        offset += t.numel()
    return flat, views


class CompressedPayloads(MessageLayout):
    """A compressed-gossip message: every tensor's `Compressor` payload back to back, decoded
    with the sender's keys of the message's step (as the receiver decodes it); `part_kind` says
    what the decoded tensors are to the receiver."""

    part_kind = "estimate"

    @classmethod
    def run_fields(cls, algorithm):
        return {"compressor": repr(algorithm.compressor), "seed": int(algorithm.seed)}

    def decode(self, message):
        if not hasattr(self, "_decoder"):
            self._decoder = CompressedMessages(
                parse_compressor(self.meta["compressor"]),
                [torch.Size(s) for s in self.shapes],
                self.dtype,
                torch.device("cpu"),
                [],
                int(self.meta["seed"]),
            )
        decoder = self._decoder
        outs = [torch.zeros(s, dtype=self.dtype) for s in self.shapes]
        payload = message["tensor"]
        views = [payload[a:b] for a, b in zip(decoder.offsets, decoder.offsets[1:])]
        decoder.decode(views, outs, int(message["step"]), int(message["sender"]))
        return [Part(self.part_kind, list(range(len(self.shapes))), outs)]


def compressed_label(pretty: str):
    """A label function: "<pretty> <compressor spec, ':' as a space>"."""

    def label(cls, options) -> str:
        compressor = options.get("compressor", "?")
        return f"{pretty} {compressor.replace(':', ' ')}"

    return classmethod(label)


class CompressedGossip(GossipAlgorithm):
    """Base class of gossip that sends every tensor through a `Compressor`.

    Owns the arguments (compressor, tuned gamma, seed), the neighbours' weights, the message
    buffers and the state plumbing; errors name the algorithm by its class name. A subclass sets the class attributes below, lists its flat
    state buffers in `state_buffers()`, and writes `_step()` with `_send_compressed`,
    `_decode_own` and `_decode_neighbors`.
    """

    options = {
        "compressor": Option("compressor", parse_compressor, "e.g. topk:0.01, sign"),
        "gamma": Option("gamma", parse_optional_float, "consensus step (required)"),
        "seed": Option("seed", parse_seed),
    }
    gamma_source = "tuned"
    directed = False

    @classmethod
    def check_config(cls, kwargs, topology: AnyTopology) -> None:
        """A compressor and a tuned γ, from the config alone: the error the constructor raises,
        on every rank before any collective."""
        compressed_gossip_arguments(
            cls.__name__,
            cls.name,
            cls.example_compressor,
            kwargs.get("compressor"),
            kwargs.get("gamma"),
            kwargs.get("seed", 0),
        )

    #: Name in the configuration agreement check ("<config_name> configuration").
    config_name = "Compressed gossip"
    #: A compressor spelling the "needs a compressor" error suggests.
    example_compressor = "sign"

    def __init__(
        self,
        params: ParamsLike,
        comm: Comm,
        compressor=None,
        gamma: Optional[float] = None,
        seed: int = 0,
    ):
        require_undirected(type(self).__name__, comm)
        super().__init__(params, comm)
        self.compressor, self.gamma, self.seed = compressed_gossip_arguments(
            self._who, self.name, self.example_compressor, compressor, gamma, seed
        )
        me, neighbors = comm.rank, comm.neighbors
        warn_if_unstable_gamma(self._who, self.gamma, comm.topology)  # a schedule's too
        if comm.is_static:
            self._weights = [comm.topology.weight(me, j) for j in neighbors]
        else:
            self._weights = None  # W(t)'s, looked up every step
        self._messages = CompressedMessages(
            self.compressor,
            [t.shape for t in self.params],
            self.dtype,
            self.device,
            neighbors,
            self.seed,
        )
        comm.check_agreement(
            f"{self.config_name} configuration", f"{self.compressor!r};{self.gamma!r};{self.seed}"
        )

    @property
    def _who(self) -> str:
        return type(self).__name__

    def _flat_state(self):
        """A zero model-sized flat buffer and its per-parameter views."""
        return flat_state(self.params, self.dtype, self.device)

    # ---- the wire --------------------------------------------------------------------------------
    def _send_compressed(
        self,
        flat: Tensor,
        tensors: Sequence[Tensor],
        neighbors: Optional[Sequence[int]] = None,
        step: Optional[int] = None,
    ) -> None:
        """Encode `tensors` (views of `flat`) once and send the payload to every neighbour (of
        `step`, when given: then `neighbors` are that step's); refuse to if `flat` holds a NaN or
        an infinity (the payload is bytes, `_exchange` cannot tell)."""
        if not bool(torch.isfinite(flat).all()):
            self._raise_non_finite()
        messages = self._messages
        messages.encode(tensors, self.steps, self.comm.rank)
        neighbors = self.comm.neighbors if neighbors is None else neighbors
        self._exchange(
            {j: messages.send for j in neighbors}, {j: messages.recv[j] for j in neighbors}, step
        )

    def _decode_own(self, outs: Sequence[Tensor]) -> None:
        """Decode this peer's own payload into `outs`: exactly what its neighbours decode of it."""
        self._messages.decode(self._messages.send_views, outs, self.steps, self.comm.rank)

    def _decode_neighbors(
        self,
        outs: Sequence[Tensor],
        neighbors: Optional[Sequence[int]] = None,
        weights: Optional[Sequence[float]] = None,
    ) -> Iterator[float]:
        """Decode each neighbour's payload into `outs` in turn, in neighbour order (deterministic
        sums), yielding its weight W[i, j] while `outs` holds it (the static neighbours and
        weights, unless a step's are given)."""
        if neighbors is None:
            neighbors, weights = self.comm.neighbors, self._weights
        for j, w in zip(neighbors, weights):
            self._messages.decode(self._messages.recv_views[j], outs, self.steps, j)
            yield w

    # ---- accounting and state ------------------------------------------------------------------
    def bytes_per_step(self) -> int:
        """Bytes of the next `step()`: one payload to each of that step's neighbours."""
        degree = len(
            self.comm.neighbors if self.comm.is_static else self.comm.neighbors_at(self.steps)
        )
        return degree * self._messages.nbytes

    @property
    def payload_bytes(self) -> int:
        """Bytes of one message (all tensors' payloads)."""
        return self._messages.nbytes

    def state_buffers(self) -> Dict[str, Tensor]:
        """The flat buffers a checkpoint must hold, by state key."""
        raise NotImplementedError

    def state_dict(self) -> Dict[str, object]:
        state: Dict[str, object] = {
            "steps": self.steps,
            "gamma": self.gamma,
            "seed": self.seed,
            "compressor": repr(self.compressor),
        }
        for key, buffer in self.state_buffers().items():
            state[key] = buffer.detach().cpu().clone()
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        saved = (state.get("compressor"), int(state.get("seed", -1)))
        mine = (repr(self.compressor), self.seed)
        if saved != mine:
            raise ValueError(
                f"{self._who} state is for compressor={saved[0]}, seed={saved[1]}; this "
                f"instance has compressor={mine[0]}, seed={mine[1]}"
            )
        for key, buffer in self.state_buffers().items():
            if key not in state:
                raise ValueError(f"{self._who} state has no {key!r}")
            value = state[key]
            if tuple(value.shape) != tuple(buffer.shape):
                raise ValueError(
                    f"{self._who} state {key!r} has {value.numel()} entries, expected "
                    f"{buffer.numel()} (was it saved for another model?)"
                )
            buffer.copy_(value)
        self.steps = int(state["steps"])
