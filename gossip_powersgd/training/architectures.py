"""The models a config's ``model`` names: `MODELS`, a `Registry` of `ModelKind` classes.

Each kind describes itself (name, summary, options with types and defaults) and builds its module
in `build(spec, parsed, input_shape, num_classes, device)`, on the ``meta`` device when asked:
`models.build_model` then checks it fits in memory, materialises it on the CPU and initialises it
from the run's seed, identically on every peer. A new model is one file with a `ModelKind`
subclass plus `register_model(...)`; anything else with a colon is a bring-your-own
``package.module:callable`` (`models.py`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..registries import Registry, Setting, option_types, with_defaults
from ..specs import Spec, check_options, spec_error, typed_options
from .zoo import LSTMLanguageModel, ResNet20, VGG16

__all__ = ["ModelKind", "MODELS", "register_model", "CNN1d", "BYO_MODEL", "WHAT"]

#: How model specs are named in errors (the grammar's style: ``model spec '<spec>': ...``).
WHAT = "model spec"
#: The spelling of a bring-your-own model, accepted beside the registered names.
BYO_MODEL = "package.module:callable[:key=value,...]"
_DEFAULT_MLP_WIDTHS = (100, 100)


class ModelKind:
    """One model. Subclasses declare `name`, `summary`, `options` ({key: Setting}) and `build`;
    `usage` (optional) is how `--help-config` and errors spell its spec."""

    name: str = None
    summary: str = None
    options: Dict[str, Setting] = {}
    usage: str = None

    def parse(self, spec: str, parsed: Spec) -> Dict[str, Any]:
        """The spec's options, typed, each missing one at its default; a number below 1 (0 for
        ``dropout``) or a dropout of 1 or more is refused."""
        options = with_defaults(
            self.options, typed_options(parsed, option_types(self.options), WHAT, spec)
        )
        for key, value in options.items():
            low = 0 if key == "dropout" else 1
            if self.options[key].type in (int, float) and value is not None and not value >= low:
                raise spec_error(WHAT, spec, f"{key} must be >= {low}, got {value}")
            if key == "dropout" and value >= 1:
                raise spec_error(WHAT, spec, f"dropout must be < 1, got {value}")
        return options

    def build(self, spec: str, parsed: Spec, input_shape, num_classes: int, device) -> nn.Module:
        raise NotImplementedError


MODELS = Registry(
    "model", "model", ModelKind, required={"build": "the method that builds it"}, extra=(BYO_MODEL,)
)
register_model = MODELS.register


class CNN1d(nn.Module):
    """Three strided 1-D convolutions with ReLU, then a linear classifier.

    Accepts ``(N, L)`` inputs (a single channel, as MNIST-1D) or ``(N, C, L)``.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        channels: int = 32,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if len(input_shape) == 1:
            in_channels, length = 1, input_shape[0]
        elif len(input_shape) == 2:
            in_channels, length = input_shape
        else:
            raise ValueError(
                f"cnn1d needs input_shape (length,) or (channels, length), got {tuple(input_shape)}"
            )
        self.in_channels = in_channels
        convs = [
            nn.Conv1d(c_in, channels, kernel_size=5, stride=2, padding=1, device=device)
            for c_in in (in_channels, channels, channels)
        ]
        self.features = nn.Sequential(*[m for conv in convs for m in (conv, nn.ReLU())])
        flat = _flattened_size(convs, in_channels, length)
        if flat == 0:
            raise ValueError(
                f"cnn1d: input length {length} is too short for three stride-2 "
                f"convolutions of kernel 5; use an input of length >= 15"
            )
        self.classifier = nn.Linear(flat, num_classes, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(len(x), self.in_channels, -1)
        return self.classifier(self.features(x).flatten(1))


def _flattened_size(convs: Sequence[nn.Conv1d], in_channels: int, length: int) -> int:
    """Features per sample after ``convs``, by a dummy forward of zeros through same-shaped convs.

    Zero weights on the CPU rather than the layers themselves: those may live on the meta device,
    whose first use imports sympy (seconds), and random weights would consume RNG state.
    """
    x = torch.zeros(1, in_channels, length)
    try:
        for conv in convs:
            weight = torch.zeros(conv.out_channels, conv.in_channels, *conv.kernel_size)
            x = F.conv1d(x, weight, stride=conv.stride, padding=conv.padding)
    except RuntimeError:  # input shorter than the kernel somewhere along the stack
        return 0
    return x.numel()


@register_model
class LogReg(ModelKind):
    name = "logreg"
    summary = "flatten -> Linear"

    def build(self, spec, parsed, input_shape, num_classes, device):
        if parsed.positional or parsed.options:
            raise spec_error(WHAT, spec, "logreg takes no options; write 'logreg'")
        return nn.Sequential(
            nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes, device=device)
        )


@register_model
class MLP(ModelKind):
    name = "mlp"
    summary = "flatten -> (Linear -> ReLU) per hidden width -> Linear (default widths 100,100)"
    usage = "mlp[:<width>,<width>,...]"

    def build(self, spec, parsed, input_shape, num_classes, device):
        check_options(parsed, (), WHAT, spec, hint=" (mlp's widths: e.g. mlp:100,100)")
        widths = _DEFAULT_MLP_WIDTHS
        if parsed.positional or ":" in spec:  # "mlp:" names no width
            try:
                widths = tuple(int(w) for w in parsed.positional)
            except ValueError:
                widths = ()
            if not widths or min(widths) < 1:
                raise spec_error(WHAT, spec, "expected positive hidden widths, e.g. mlp:100,100")
        layers: list[nn.Module] = [nn.Flatten()]
        fan_in = math.prod(input_shape)
        for width in widths:
            layers += [nn.Linear(fan_in, width, device=device), nn.ReLU()]
            fan_in = width
        layers.append(nn.Linear(fan_in, num_classes, device=device))
        return nn.Sequential(*layers)


@register_model
class CNN1dKind(ModelKind):
    name = "cnn1d"
    summary = "the MNIST-1D paper's CNN: 3 x (Conv1d(k=5, s=2, p=1) -> ReLU) -> flatten -> Linear"
    options = {"channels": Setting(int, 32, "channels of each convolution")}

    def build(self, spec, parsed, input_shape, num_classes, device):
        options = self.parse(spec, parsed)
        return CNN1d(input_shape, num_classes, channels=options["channels"], device=device)


@register_model
class ResNet20Kind(ModelKind):
    name = "resnet20"
    summary = "the CIFAR ResNet-20 of the PowerGossip / Choco-SGD experiments; image inputs"
    options = {"width": Setting(int, 16, "channels of the first stage")}

    def build(self, spec, parsed, input_shape, num_classes, device):
        options = self.parse(spec, parsed)
        return ResNet20(input_shape, num_classes, width=options["width"], device=device)


@register_model
class VGG16Kind(ModelKind):
    name = "vgg16"
    summary = "VGG-16 for 32x32 images, with BatchNorm unless bn=false"
    options = {
        "bn": Setting(bool, True, "BatchNorm after each convolution"),
        "width": Setting(int, 64, "channels of the first stage"),
        "dropout": Setting(float, 0.5, "dropout of the classifier"),
    }

    def build(self, spec, parsed, input_shape, num_classes, device):
        options = self.parse(spec, parsed)
        return VGG16(
            input_shape,
            num_classes,
            width=options["width"],
            batch_norm=options["bn"],
            dropout=options["dropout"],
            device=device,
        )


@register_model
class LSTMKind(ModelKind):
    name = "lstm_lm"
    summary = "an LSTM language model over token sequences; its classes are the vocabulary"
    options = {
        "layers": Setting(int, 2, "LSTM layers"),
        "hidden": Setting(int, 200, "hidden units per layer"),
        "embedding": Setting(int, None, "embedding size (default: hidden)"),
        "tied": Setting(bool, True, "tie the embedding and output weights"),
        "dropout": Setting(float, 0.2, "dropout between layers"),
    }

    def build(self, spec, parsed, input_shape, num_classes, device):
        options = self.parse(spec, parsed)
        return LSTMLanguageModel(
            input_shape,
            num_classes,
            layers=options["layers"],
            hidden=options["hidden"],
            embedding=options["embedding"],
            tied=options["tied"],
            dropout=options["dropout"],
            device=device,
        )
