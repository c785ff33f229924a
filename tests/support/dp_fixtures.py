"""A small model, data and the one-line-error check the DP-SGD tests share (tests/privacy/
test_dpsgd.py, test_sampling.py, test_model_check.py)."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn
from torch.nn import functional as F


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def data(n: int, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()


def one_line_error(fn, *args, match: str, **kwargs) -> str:
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text
    return text


def weights_only_round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)
