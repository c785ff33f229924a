"""training/architectures.py: the registered model kinds, their options and the 1-D CNN (building
and initialising them from a seed: test_models.py; the paper's models: test_zoo.py)."""

import pytest
import torch
from torch import nn

from gossip_powersgd.specs import parse_spec
from gossip_powersgd.training.architectures import MODELS, CNN1d, _flattened_size
from gossip_powersgd.training.models import build_model, count_parameters


def parse(name, spec):
    return MODELS.get(name).parse(spec, parse_spec(spec))


def test_parse_fills_every_missing_option_with_its_declared_default():
    assert parse("lstm_lm", "lstm_lm:hidden=8") == {
        "layers": 2,
        "hidden": 8,
        "embedding": None,
        "tied": True,
        "dropout": 0.2,
    }
    assert parse("vgg16", "vgg16:bn=false,dropout=0") == {"bn": False, "width": 64, "dropout": 0.0}
    assert parse("cnn1d", "cnn1d") == {"channels": 32}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("vgg16:dropout=-0.1", "dropout must be >= 0, got -0.1"),
        ("vgg16:dropout=1.0", "dropout must be < 1, got 1.0"),
        ("lstm_lm:layers=0", "layers must be >= 1, got 0"),
        ("cnn1d:channels=-3", "channels must be >= 1, got -3"),
    ],
)
def test_parse_refuses_out_of_range_numbers_in_one_line_naming_the_spec(spec, message):
    with pytest.raises(ValueError, match=rf"^model spec '{spec}': {message}$"):
        parse(spec.split(":")[0], spec)


@pytest.mark.parametrize("shape", [(15,), (40,), (3, 64), (1, 100)])
def test_the_classifier_is_sized_by_the_convolutions_closed_form(shape):
    """Each conv (kernel 5, stride 2, padding 1) maps a length L to floor((L - 3) / 2) + 1."""
    length = shape[-1]
    for _ in range(3):
        length = (length - 3) // 2 + 1
    model = CNN1d(shape, 10, channels=6)
    assert model.classifier.in_features == 6 * length
    convs = [m for m in model.features if isinstance(m, nn.Conv1d)]
    assert _flattened_size(convs, model.in_channels, shape[-1]) == 6 * length


def test_too_short_an_input_is_refused_naming_the_shortest_that_works():
    """The closed form above reaches length 0 below 15 (14 -> 6 -> 2 -> 0): the error names 15,
    and 15 builds."""
    with pytest.raises(ValueError, match=r"^cnn1d: input length 14 is too short .* length >= 15$"):
        CNN1d((14,), 10)
    assert CNN1d((15,), 10).classifier.in_features == 32


def test_mlp_has_a_linear_layer_per_width_then_the_classifier():
    model = build_model("mlp:7,5", (2, 3), 4, seed=0)
    linears = [(m.in_features, m.out_features) for m in model if isinstance(m, nn.Linear)]
    assert linears == [(6, 7), (7, 5), (5, 4)]
    assert sum(isinstance(m, nn.ReLU) for m in model) == 2
    default = build_model("mlp", (6,), 4, seed=0)
    assert [m.out_features for m in default if isinstance(m, nn.Linear)] == [100, 100, 4]


def test_parameter_counts():
    assert count_parameters(build_model("logreg", (40,), 10, 0)) == 40 * 10 + 10
    assert count_parameters(build_model("mlp", (40,), 10, 0)) == (40 * 100 + 100) + (
        100 * 100 + 100
    ) + (100 * 10 + 10)
    # cnn1d: lengths 40 -> 19 -> 9 -> 4, so the classifier sees 4 * channels features.
    for c in (8, 25, 32):
        expected = (1 * c * 5 + c) + 2 * (c * c * 5 + c) + (4 * c * 10 + 10)
        spec = "cnn1d" if c == 32 else f"cnn1d:channels={c}"
        assert count_parameters(build_model(spec, (40,), 10, 0)) == expected


def test_cnn1d_accepts_channel_inputs():
    model = build_model("cnn1d:channels=4", (40,), 10, 0)
    x = torch.randn(3, 40)
    assert torch.equal(model(x), model(x.unsqueeze(1)))
    two = build_model("cnn1d:channels=4", (2, 64), 5, 0)
    assert two(torch.randn(3, 2, 64)).shape == (3, 5)
