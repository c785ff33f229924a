"""`privacy.model_check`: a model Opacus cannot train per example is refused in one line naming
the layer and both fixes; `dp_fix_model` replaces BatchNorm and the fixed model trains privately."""

from __future__ import annotations

import torch
from torch import nn

from gossip_powersgd.privacy import DPSGD, validate_model
from dp_fixtures import backward, data, one_line_error


def test_batchnorm_is_refused_naming_the_layer_and_both_fixes():
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    text = one_line_error(validate_model, model, match="BatchNorm1d")
    assert "'1'" in text and "GroupNorm" in text and "dp_fix_model: true" in text
    dp = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=20)
    one_line_error(dp.wrap, model, match="BatchNorm1d")


def test_fix_replaces_batchnorm_and_the_fixed_model_trains_privately():
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    fixed = validate_model(model, fix=True)
    assert isinstance(fixed[1], nn.GroupNorm)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in fixed.modules())
    dp = DPSGD(0.5, 1.0, sample_rate=0.5, shard_size=20)
    wrapped = dp.wrap(fixed)
    x, y = data(10)
    backward(wrapped, x, y)
    dp.privatize(wrapped, 10)
    assert all(torch.isfinite(p.grad).all() for p in wrapped.parameters())


def test_a_model_without_trainable_parameters_is_refused():
    one_line_error(validate_model, nn.ReLU(), match="no.*trainable|has none")
    frozen = nn.Linear(3, 2).requires_grad_(False)
    one_line_error(validate_model, frozen, match="has none")
