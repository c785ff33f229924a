"""DP settings (privacy/dp_config.py) that a run must refuse in one line naming the problem and the
fix: a DP key while DP is off, noise beyond any signal, an absurd noise multiplier (not a
divergence), a divergence under DP naming the noise; dp_fix_model on a class defined in a function."""

import pickle

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import TINY, cli, one_error
from tests.conftest import tiny_config as tiny
from tests.conftest import errors_on_every_rank as every_rank


@pytest.mark.parametrize(
    "setting",
    [
        "dp_max_grad_norm=1",
        "dp_secure_noise=true",
        "dp_delta=1e-5",
        "dp_accountant=prv",
        "dp_fix_model=true",
        "dp_secret=run_dir",
        "dp_public_randomness=true",
    ],
)
def test_a_dp_key_while_dp_is_off_is_refused_naming_it(setting, capsys, tmp_path):
    key = setting.split("=")[0]
    expected = (
        f"{key} is set but differential privacy is off (neither dp_noise_multiplier nor "
        "dp_target_epsilon is set): set one of them to turn DP on (e.g. "
        f"dp_noise_multiplier: 1.0), or drop {key}"
    )
    with pytest.raises(ValueError) as info:
        tiny(setting)
    assert str(info.value) == expected
    code, lines = cli(
        ["--config", TINY, "--set", setting, "--set", f"out_dir={tmp_path / 'r'}"], capsys
    )
    assert code != 0 and lines == [f"error: {expected}"] and not (tmp_path / "r").exists()
    # with DP on, the same key is what it was for (dp_secret: run_dir needs a run directory)
    on = tiny(setting, "dp_noise_multiplier=1.0", "dp_max_grad_norm=1", f"out_dir={tmp_path}")
    assert getattr(on, key) is not None


def test_noise_beyond_any_signal_is_refused_at_the_bound():
    pytest.importorskip("opacus")
    from gossip_powersgd.privacy.training import check_noise_scale

    bound = 32 * np.sqrt(39 * 4)  # batch x sqrt(steps x peers)
    check_noise_scale(bound, 32, 39, 4)  # at the bound: allowed
    with pytest.raises(
        ValueError,
        match=rf"^dp_noise_multiplier={np.nextafter(bound, 1e9):g} is "
        rf"too large to learn anything: .* = {bound:.4g}, batch 32",
    ):
        check_noise_scale(np.nextafter(bound, 1e9), 32, 39, 4)
    with pytest.raises(
        ValueError,
        match=r"^dp_target_epsilon=1e-06 needs dp_noise_multiplier "
        r"1e\+04, .*raise dp_target_epsilon",
    ):
        check_noise_scale(1e4, 32, 39, 4, target_epsilon=1e-6)


def test_an_absurd_noise_multiplier_is_one_line_on_every_rank_not_a_divergence(tmp_path):
    pytest.importorskip("opacus")
    out = tmp_path / "run"
    # tiny: 3 epochs of 13 steps on 4 peers, batch 32
    error = one_error(
        every_rank(tiny("dp_noise_multiplier=1e30", "dp_max_grad_norm=1", f"out_dir={out}"))
    )
    assert error == (
        "ValueError: dp_noise_multiplier=1e+30 is too large to learn anything: over "
        "the run's 39 steps on 4 peers its noise exceeds the largest signal the "
        "clipped gradients can carry (sigma must be at most batch x sqrt(steps x "
        f"peers) = {32 * np.sqrt(39 * 4):.4g}, batch 32 the expected batch size); "
        "lower dp_noise_multiplier (or train longer)"
    )
    assert not out.exists()


def test_a_divergence_under_dp_names_the_noise():
    pytest.importorskip("opacus")
    # sigma 200 is below tiny's bound for one epoch (32 x sqrt(13 x 4) = 231); with lr 1e6 the
    # loss is about 20 x the divergence limit, whatever the noise's draws. Under DP no training
    # loss is shared (peer statistics stay private): the epoch's eval record's test loss is it.
    error = one_error(
        every_rank(tiny("dp_noise_multiplier=200", "dp_max_grad_norm=1", "lr=1e6", "epochs=1"))
    )
    assert error.startswith("NonFiniteError: the run diverged: ")
    # sigma x C / B = 200 x 1 / 32
    assert error.endswith(
        "; DP is on and its noise is a likely cause: its std sigma x C / B is 6.25 "
        "on each coordinate of the gradient, 6.25 x the clipping norm C = 1 that "
        "bounds the whole clipped gradient (B = 32, the batch size): lower "
        "dp_noise_multiplier (or raise dp_target_epsilon)"
    ), error


def _batchnorm_layers(d, classes):
    return [nn.Linear(d, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, classes)]


def local_class_net(input_shape, num_classes):
    class Local(nn.Module):  # defined here: pickle cannot name it
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(*_batchnorm_layers(int(np.prod(input_shape)), num_classes))

        def forward(self, x):
            return self.body(x.flatten(1))

    return Local()


def test_dp_fix_model_fixes_a_locally_defined_class_without_pickling_it():
    pytest.importorskip("opacus")
    from opacus.validators import ModuleValidator

    from gossip_powersgd.privacy import validate_model

    net = local_class_net((20,), 4)
    with pytest.raises((pickle.PicklingError, AttributeError)):  # "Can't pickle local object"
        pickle.dumps(net)  # what Opacus' fix does (torch.save) and fails on
    fixed = validate_model(net, fix=True)
    assert isinstance(fixed.body[1], nn.GroupNorm) and isinstance(net.body[1], nn.BatchNorm1d)
    # the same replacement as Opacus' own fix, on a model it can pickle
    torch.manual_seed(0)
    plain = nn.Sequential(*_batchnorm_layers(20, 4))
    ours, theirs = validate_model(plain, fix=True), ModuleValidator.fix(plain)
    assert str(ours) == str(theirs)
    assert all(
        torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values())
    )
    s = every_rank(
        tiny(
            "model=tests.privacy.test_dp_config:local_class_net",
            "dp_noise_multiplier=1",
            "dp_max_grad_norm=1",
            "dp_fix_model=true",
            "epochs=1",
        )
    )
    assert s == ["ok"] * 4


def test_augmentation_under_dp_is_refused_on_every_rank_naming_the_option_that_turns_it_off(
    capsys, tmp_path
):
    """synthetic_images and cifar10 augment by default, and a record's crop and flip are drawn by
    its position in the batch: one record added to a Poisson batch moves every later record's
    draw, so the step's clipped sum moves by more than C (the sensitivity DP-SGD assumes)."""
    from gossip_powersgd.training.batches import Batches
    from gossip_powersgd.training.records import cifar_augment

    # the premise: the same record, at position 0 or 1 of the same step's batch, is augmented
    # differently (a public generator of (seed, rank, epoch, step), drawn in the batch's order)
    x = torch.rand(9, 3, 32, 32)
    generator = Batches(x, torch.zeros(9), 4, seed=0, rank=1)._generator
    alone = cifar_augment(x[1:], generator(0, 5))
    joined = cifar_augment(x, generator(0, 5))
    assert not all(torch.equal(alone[k], joined[k + 1]) for k in range(8))

    dp = ["dp_noise_multiplier=1.0", "dp_max_grad_norm=1"]
    data = "synthetic_images:n=64,test=16"
    for spec, fixed in [
        (data, f"{data},augment=false"),
        ("synthetic_images:augment=true,n=64", "synthetic_images:augment=false,n=64"),
        ("cifar10:root=cifar", "cifar10:root=cifar,augment=false"),
    ]:
        expected = (
            f"dataset {spec!r} augments its training records, drawing each record's crop and "
            "flip by its position in the batch: under differential privacy one record would "
            "change the others' and the step would move by more than dp_max_grad_norm; turn it "
            f"off: dataset: {fixed}"
        )
        with pytest.raises(ValueError) as info:
            tiny(f"dataset={spec}", *dp)
        assert str(info.value) == expected
    out = tmp_path / "r"
    code, lines = cli(
        ["--config", TINY, "--set", f"dataset={data}", "--set", dp[0], "--set", dp[1]]
        + ["--set", f"out_dir={out}"],
        capsys,
    )
    expected = expected.replace("'cifar10:root=cifar'", repr(data))
    expected = expected.replace("cifar10:root=cifar,augment=false", f"{data},augment=false")
    assert code != 0 and lines == [f"error: {expected}"] and not out.exists()
    config = tiny(*dp).replace(dataset=data)  # built in code: each rank's config check refuses it
    assert one_error(every_rank(config)) == f"ValueError: {expected}"
    # without augmentation, or without DP, the dataset is accepted
    assert tiny(f"dataset={data},augment=false", *dp).dataset.endswith("augment=false")
    assert tiny(f"dataset={data}").dataset == data
