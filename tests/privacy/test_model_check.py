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


def test_a_layer_keeping_running_statistics_is_refused_with_or_without_weights():
    # InstanceNorm with track_running_stats=True does not mix the examples, but in training mode
    # it folds every private batch into running_mean / running_var: no noise, and evaluation
    # averages them over the peers. With no trainable parameter of its own it used to pass.
    for affine in (False, True):
        norm = nn.InstanceNorm1d(4, affine=affine, track_running_stats=True)
        model = nn.Sequential(nn.Conv1d(2, 4, 3), norm, nn.Flatten(), nn.Linear(36, 3))
        before = model.state_dict()["1.running_mean"].clone()
        model(torch.randn(5, 2, 11))
        assert not torch.equal(model.state_dict()["1.running_mean"], before)  # data went in
        for fix in (False, True):
            text = one_line_error(validate_model, model, fix=fix, match="InstanceNorm1d")
            assert "'1'" in text and "running_mean" in text
            assert "track_running_stats=False" in text
        dp = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=20)
        one_line_error(dp.wrap, model, match="track_running_stats=False")
    # the same layers without running statistics keep no buffer and are accepted
    plain = nn.Sequential(nn.Conv1d(2, 4, 3), nn.InstanceNorm1d(4), nn.Flatten(), nn.Linear(36, 3))
    assert validate_model(plain) is plain
