"""Frozen parameters (an `nn.Parameter` with ``requires_grad=False``): every algorithm (PowerSGD too)
leaves them out, as the optimizer and DDP do (`GossipAlgorithm.__init__` calls these)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, List, Sequence, Tuple

import torch

from ..comm.base import Tensor
from ..errors import AgreementError

if TYPE_CHECKING:
    from ..comm.base import Comm


def is_frozen(tensor: Tensor) -> bool:
    """A parameter no optimizer moves: an `nn.Parameter` with ``requires_grad=False``."""
    return isinstance(tensor, torch.nn.Parameter) and not tensor.requires_grad


def leave_frozen_out(
    who: str, names: Sequence[str], tensors: Sequence[Tensor]
) -> Tuple[List[str], List[Tensor], List[Tuple[str, Tensor]]]:
    """(names, tensors) to gossip, and the (name, tensor) pairs left out as frozen: an `nn.Parameter` with
    ``requires_grad=False`` (a frozen layer) is moved by no optimizer and starts equal on every
    peer (`build_model` draws every peer's model from one seed), so gossiping it would only send
    bytes and move it by rounding; it is left out, as the optimizer and DDP leave it out. A plain
    tensor is state to average whatever its ``requires_grad``. All frozen is refused in one line."""
    frozen = [(name, t) for name, t in zip(names, tensors) if is_frozen(t)]
    if tensors and len(frozen) == len(tensors):
        raise ValueError(
            f"{who}: all {len(tensors)} parameters are frozen (requires_grad=False), so nothing "
            "would be sent: unfreeze at least one, or pass the parameters of a model that trains"
        )
    kept = [(name, t) for name, t in zip(names, tensors) if not is_frozen(t)]
    return [name for name, _ in kept], [t for _, t in kept], frozen


def check_frozen_agree(who: str, comm: Comm, frozen: Sequence[Tuple[str, Tensor]]) -> None:
    """Refuse, on every rank, frozen parameters whose values differ between peers: left out of the
    gossip, they would stay different forever (collective; nothing is checked without any)."""
    if not frozen:
        return
    values = hashlib.sha256()
    for _, t in frozen:
        values.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    try:
        comm.check_agreement(f"{who}: frozen parameters' values", values.hexdigest())
    except AgreementError as exc:
        raise AgreementError(
            f"{exc} (they are left out of the averaging, so they would never agree): build them from "
            "one seed on every peer, or unfreeze them (requires_grad=True) to average them"
        ) from None


def check_still_frozen(who: str, frozen: Sequence[Tuple[str, Tensor]]) -> None:
    """Refuse, in one line, a parameter left out as frozen that has been unfrozen since (a
    fine-tuning schedule): it would train without ever being gossiped."""
    for name, t in frozen:
        if t.requires_grad:
            raise ValueError(
                f"{who}: parameter {name} was frozen when the algorithm was built (so it is not "
                "gossiped) and now requires_grad: build the algorithm again after unfreezing"
            )
