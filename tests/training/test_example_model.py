"""A new model is one file plus one registry line: this file is the file,
`register_model(TwoLayer)` (in the fixture, so that the registry other tests see stays as shipped)
the line. The class describes itself; `build_model` builds it on the meta device, materialises and
initialises it from the seed like every built-in model, and `run` trains it from a config."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gossip_powersgd import run
from gossip_powersgd.cli.help import describe_registries
from gossip_powersgd.registries import Setting
from gossip_powersgd.training.architectures import MODELS, ModelKind, register_model
from gossip_powersgd.training.models import build_model, count_parameters


class TwoLayer(ModelKind):
    name = "twolayer"
    summary = "flatten -> Linear -> tanh -> Linear (the example model)"
    options = {"hidden": Setting(int, 16, "hidden units")}

    def build(self, spec, parsed, input_shape, num_classes, device):
        hidden = self.parse(spec, parsed)["hidden"]
        fan_in = int(torch.Size(input_shape).numel())
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(fan_in, hidden, device=device),
            nn.Tanh(),
            nn.Linear(hidden, num_classes, device=device),
        )


@pytest.fixture
def registered():
    register_model(TwoLayer)
    yield
    MODELS.unregister("twolayer")


def test_it_is_built_deterministically_without_touching_the_global_rng(registered):
    state = torch.random.get_rng_state()
    first = build_model("twolayer:hidden=5", (20,), 4, seed=7)
    again = build_model("twolayer:hidden=5", (20,), 4, seed=7)
    assert torch.equal(state, torch.random.get_rng_state())
    assert count_parameters(first) == 20 * 5 + 5 + 5 * 4 + 4
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
    assert all(p.device.type == "cpu" for p in first.parameters())
    other = build_model("twolayer:hidden=5", (20,), 4, seed=8)
    assert not torch.equal(first[1].weight, other[1].weight)
    with pytest.raises(ValueError, match=r"hidden must be >= 1, got 0"):
        build_model("twolayer:hidden=0", (20,), 4)
    assert "  twolayer  flatten -> Linear -> tanh" in describe_registries()


def test_a_config_naming_it_trains(registered):
    result = run(
        dict(
            topology="ring:4",
            algorithm="powergossip:rank=1",
            dataset="synthetic_logreg:d=20,classes=4,n=2000",
            model="twolayer:hidden=8",
            lr=0.5,
            epochs=2,
            eval_every=1,
            seed=0,
            quiet=True,
        ),
        states=True,
    )
    assert sum(t.numel() for t in result.states[0].values()) == 20 * 8 + 8 + 8 * 4 + 4
    assert result.acc_avg > 0.6  # 4 classes: chance is 0.25; logreg reaches ~0.85 here


def test_unregistered_it_is_an_unknown_name_again(registered):
    MODELS.unregister("twolayer")
    with pytest.raises(ValueError, match=r"unknown name 'twolayer'.*logreg"):
        build_model("twolayer", (20,), 4)
