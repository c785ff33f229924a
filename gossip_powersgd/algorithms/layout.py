"""What an algorithm's messages hold, declared by the algorithm, for anyone who reads them.

An observer (`privacy.views` records, `privacy.reconstruction` estimates) never looks inside an
algorithm: each algorithm class names a `MessageLayout` subclass (its `layout` attribute), and
the observer goes through it only:

    layout = Algorithm.layout.of(algorithm)    at recording time, on the live peer
    layout.fields                              plain data saved with the view (groups, seeds, ...)
    layout.annotate(algorithm, sender)         per message, at delivery: what else the receiver
                                               legitimately knows of it ("kind": PowerGossip's
                                               half-step side on that edge, its shared factors)
    Algorithm.layout(meta).decode(message)     later, from the saved view alone: the message as
                                               `Part`s, each saying which of the sender's
                                               parameters it carries, and how

A `Part`'s kind is what the receiver can do with it:

    "model"      values[k] is the sender's parameter indices[k] as it was when the step began
    "estimate"   values[k] is an estimate the protocol publishes of it (DeepSqueeze's C(x_j + δ_j))
    "increment"  values[k] is added to the copy the receiver keeps of it (Choco's q_j; the copy
                 starts at zero, so the sum of all increments so far is the copy)
    "right"      `block` is (M Q)^T for the (batch, rows, cols) stack of parameters `indices`,
                 `factor` the shared Q (batch, cols, r) it was computed with
    "left"       `block` is (M^T P)^T = P^T M, `factor` the shared P (batch, rows, r)

`meta` (what `decode` gets) is the view's: "shapes", "dtype", "observer", "neighbors", plus the
layout's own `fields`. Messages are dicts with "tensor" (as delivered), "sender", "step",
"exchange" (0-based within the step) and whatever `annotate` returned.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..comm.base import Tensor

PART_KINDS = ("model", "estimate", "increment", "right", "left")


@dataclasses.dataclass
class Part:
    """One piece of a decoded message (see the module docstring for the kinds)."""

    kind: str
    indices: List[int]
    values: Optional[List[Tensor]] = None  # "model", "estimate", "increment": one per index
    block: Optional[Tensor] = None  # "right" / "left": (batch, r, rows | cols)
    factor: Optional[Tensor] = None  # "right": Q (batch, cols, r); "left": P (batch, rows, r)
    rows: int = 0
    cols: int = 0


def unflatten(flat: Tensor, shapes: Sequence[Sequence[int]]) -> List[Tensor]:
    """Consecutive pieces of `flat` shaped like `shapes` (copies)."""
    out, offset = [], 0
    for shape in shapes:
        numel = torch.Size(shape).numel()
        out.append(flat[offset : offset + numel].reshape(shape).clone())
        offset += numel
    return out


class MessageLayout:
    """Base class: a layout built from a view's `meta`; subclasses say what a message holds."""

    #: False for algorithms that talk only through collectives (all-reduce): nothing to record.
    point_to_point = True

    def __init__(self, meta: Dict[str, Any]):
        self.meta = meta
        #: The layout's own keys of `meta` (set by `of`; a view saves them in its meta).
        self.fields: Dict[str, Any] = {}
        self.shapes = [list(s) for s in meta["shapes"]]
        self.dtype = getattr(torch, meta["dtype"])

    @classmethod
    def of(cls, algorithm) -> "MessageLayout":
        """The layout of a live algorithm's messages (its view meta, without the view's keys)."""
        fields = cls.run_fields(algorithm)
        meta = {
            "shapes": [list(p.shape) for p in algorithm.params],
            "dtype": str(algorithm.dtype).replace("torch.", ""),
            "observer": int(algorithm.comm.rank),
            "neighbors": [int(j) for j in algorithm.comm.neighbors],
            **fields,
        }
        layout = cls(meta)
        layout.fields = fields
        return layout

    @classmethod
    def run_fields(cls, algorithm) -> Dict[str, Any]:
        """Plain data, fixed for the run, that `decode` needs beyond the shapes and the dtype."""
        return {}

    def annotate(self, algorithm, sender: int) -> Dict[str, Any]:
        """What the receiver knows of the message just delivered from `sender`, besides its bytes
        (called right after the exchange, before the algorithm uses the message)."""
        return {"kind": ""}

    def decode(self, message: Dict[str, Any]) -> List[Part]:
        raise NotImplementedError


class WholeModel(MessageLayout):
    """Every message is the sender's parameters, flattened one after the other (exact gossip)."""

    def decode(self, message):
        return [
            Part("model", list(range(len(self.shapes))), unflatten(message["tensor"], self.shapes))
        ]


class NoMessages(MessageLayout):
    """The algorithm talks through collectives only (all-reduce): a view of it stays empty."""

    point_to_point = False

    def decode(self, message):
        raise ValueError(
            "this algorithm sends no point-to-point messages (it all-reduces): there "
            "is nothing of a neighbour's to decode"
        )


class Undeclared(MessageLayout):
    """An algorithm registered without a layout (`registry.register_factory`): its messages are
    recorded, but nothing can be read from them."""

    def decode(self, message):
        raise ValueError(
            f"algorithm {self.meta.get('algorithm', '?')!r} declares no message layout: "
            "set its class's `layout` to a MessageLayout that decodes its messages"
        )


__all__ = [
    "MessageLayout",
    "NoMessages",
    "PART_KINDS",
    "Part",
    "Undeclared",
    "WholeModel",
    "unflatten",
]
