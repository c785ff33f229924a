"""Where a peer's model lives: the torch device of the config's `device` for a rank, and on a
transport that moves CUDA tensors on a GPU of its own (backend torch) that transport's GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from ..comm.base import Comm

__all__ = ["resolve_device", "model_device"]


def resolve_device(spec: str, rank: int) -> torch.device:
    """The torch device of `spec` ("cpu", "cuda", "cuda:K", "auto") for `rank`: plain "cuda" spreads
    the ranks over the visible GPUs; a cuda:K beyond them is refused in one line."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available (use device: cpu)")
    if spec == "cuda":
        return torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    device = torch.device(spec)
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()  # CUDA itself fails later: "invalid device ordinal"
        raise ValueError(
            f"bad value for 'device': {spec!r} (this machine has {count} GPU(s), cuda:0 to "
            f"cuda:{count - 1}; or device cuda spreads the peers over them)"
        )
    return device


def model_device(spec: str, comm: Comm) -> torch.device:
    """The device of this peer's model: `resolve_device`'s for its rank, except that a CUDA model
    takes the GPU its transport moves tensors on where it has one (backend torch: its host's
    LOCAL_RANK-th). cuda:rank%count is another GPU on a host whose ranks do not start at 0 (the
    second host of a launch with fewer processes per host than GPUs), and the transport then
    refused the model's tensors. A GPU named (cuda:K) that is not the transport's is refused in
    one line: the transport cannot move it."""
    device = resolve_device(spec, comm.rank)
    own: Optional[torch.device] = getattr(getattr(comm, "transport", comm), "device", None)
    if device.type != "cuda" or not isinstance(own, torch.device) or own.type != "cuda":
        return device
    if spec.startswith("cuda:") and device != own:
        raise ValueError(
            f"bad value for 'device': {spec!r} (this process's transport moves tensors on its "
            f"host's LOCAL_RANK-th GPU, {own}: set device cuda or auto)"
        )
    return own
