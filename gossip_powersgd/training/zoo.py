"""The paper's architectures: ResNet-20 and VGG-16 for CIFAR-sized images, an LSTM language model.

These are the networks of the PowerGossip paper's experiments, which take them from Tao Lin's
code (the Choco-SGD / local-SGD papers): `ResNet20` is the CIFAR ResNet of He et al. (2016) with
3 stages of 3 basic blocks and 1x1-convolution + BatchNorm shortcuts where the shape changes
(272,474 parameters at width 16 for 10 classes), `VGG16` the 13-convolution VGG with a
512-512-classes classifier, with or without BatchNorm, and `LSTMLanguageModel` an embedding, a
stacked LSTM and a (possibly tied) decoder that predicts a token at every position.

The classes are built on whatever device they are given (`models.build_model` uses ``meta``, then
draws every value from a local generator with `init_zoo_module`), so building one never touches
the global RNG.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "ResNet20",
    "VGG16",
    "LSTMLanguageModel",
    "SeededDropout",
    "seed_dropout_per_peer",
    "init_zoo_module",
    "VGG16_LAYOUT",
]


class SeededDropout(nn.Module):
    """Dropout whose masks come from the module's own generator, never from torch's global RNG.

    Peers that are threads of one process share the global RNG, so ``nn.Dropout`` would make a
    run's result depend on thread timing (and differ between transports). The generator's state
    is a buffer (``rng_state``), so it is checkpointed with the model and a resumed run draws the
    same masks. `build_model` seeds it from the model's seed; the trainer then gives each peer its
    own stream (`seed_dropout_per_peer`, from the seed and the rank), so that peers do not drop
    the same units at the same steps. Masks are drawn on the CPU.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = float(p)
        self.register_buffer("rng_state", torch.Generator().get_state())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        generator = torch.Generator()
        generator.set_state(self.rng_state.cpu())
        keep = torch.rand(x.shape, generator=generator) >= self.p
        self.rng_state.copy_(generator.get_state())
        return x * keep.to(x.device, x.dtype) / (1 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


#: Distinguishes the dropout masks' streams from every other seeded stream of a peer.
_DROPOUT_STREAM = 0xD50


def seed_dropout_per_peer(model: nn.Module, seed: int, rank: int) -> None:
    """Give every `SeededDropout` of `model` this peer's own mask stream, a pure function of
    (seed, rank, the module's position): reproducible, the same under every transport, and
    different from every other peer's."""
    import numpy as np

    for k, module in enumerate(m for m in model.modules() if isinstance(m, SeededDropout)):
        words = np.random.SeedSequence([int(seed), int(rank), k, _DROPOUT_STREAM]).generate_state(2)
        generator = torch.Generator().manual_seed((int(words[0]) << 31) ^ int(words[1]))
        module.rng_state.copy_(generator.get_state())


def _image_shape(name: str, input_shape: Sequence[int]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(
            f"{name} needs image inputs (channels, height, width), got "
            f"input_shape {tuple(input_shape)}"
        )
    return tuple(int(s) for s in input_shape)


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, device):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(c_out, device=device)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(c_out, device=device)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False, device=device),
                nn.BatchNorm2d(c_out, device=device),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class ResNet20(nn.Module):
    """CIFAR ResNet-20: conv3x3(width) -> 3 stages x 3 basic blocks (width, 2 width, 4 width;
    stride 2 at the start of stages 2 and 3) -> global average pool -> linear."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, width: int = 16, device=None):
        super().__init__()
        channels, _, _ = _image_shape("resnet20", input_shape)
        self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(width, device=device)
        blocks, c_in = [], width
        for stage, c_out in enumerate((width, 2 * width, 4 * width)):
            for i in range(3):
                blocks.append(_BasicBlock(c_in, c_out, 2 if stage and i == 0 else 1, device))
                c_in = c_out
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, num_classes, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


#: VGG-16's convolution widths (at width 64) and max-pools ("M").
VGG16_LAYOUT = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
)


class VGG16(nn.Module):
    """VGG-16 for 32x32 images: 13 conv3x3 (+ BatchNorm with ``batch_norm``) + ReLU layers, five
    2x2 max-pools, then dropout -> linear(8 w, 8 w) -> ReLU -> dropout -> linear(8 w, 8 w) -> ReLU
    -> linear(8 w, classes), where w is ``width`` (64 in VGG-16)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        width: int = 64,
        batch_norm: bool = True,
        dropout: float = 0.5,
        device=None,
    ):
        super().__init__()
        c_in, height, wide = _image_shape("vgg16", input_shape)
        if min(height, wide) < 32:
            raise ValueError(
                f"vgg16 needs images of at least 32x32 pixels (five 2x2 max-pools), "
                f"got {height}x{wide}"
            )
        layers: list[nn.Module] = []
        for item in VGG16_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            c_out = item * width // 64
            layers.append(nn.Conv2d(c_in, c_out, 3, padding=1, bias=not batch_norm, device=device))
            if batch_norm:
                layers.append(nn.BatchNorm2d(c_out, device=device))
            layers.append(nn.ReLU())
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            SeededDropout(dropout),
            nn.Linear(c_in, c_in, device=device),
            nn.ReLU(),
            SeededDropout(dropout),
            nn.Linear(c_in, c_in, device=device),
            nn.ReLU(),
            nn.Linear(c_in, num_classes, device=device),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)  # 1x1 already for 32x32 inputs
        return self.classifier(x.flatten(1))


class LSTMLanguageModel(nn.Module):
    """Word-level language model: embedding -> dropout -> `layers` single-layer LSTMs with dropout
    after each -> linear decoder to the vocabulary, whose weight is the embedding's with ``tied``
    (then the embedding size is ``hidden``). The layers are separate ``nn.LSTM`` modules so that
    the dropout between them is a `SeededDropout` (``nn.LSTM``'s own draws from the global RNG);
    the parameters are those of one ``nn.LSTM(embedding, hidden, layers)``.

    Input: token ids ``(batch, bptt)``; output: logits ``(batch, bptt, vocabulary)``, one
    prediction per position. With `carry_state` (truncated BPTT, set by the trainer when a peer's
    batches are contiguous streams of its text: `batches.StreamBatches`), each batch starts from
    the previous batch's final hidden state, detached (no gradient crosses a batch), row k from
    row k (a batch with fewer rows takes the first ones: the streams that still run);
    `reset_state` starts the streams again from zero. Without it every batch starts from zero
    (batches drawn at random positions of the text have no previous batch). The carried state is
    not a parameter or a buffer: `get_state` / `set_state` move it (the stream's checkpoint).
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        layers: int = 2,
        hidden: int = 200,
        embedding: int | None = None,
        tied: bool = True,
        dropout: float = 0.2,
        device=None,
    ):
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(
                f"lstm_lm needs token sequences (bptt,) as inputs, got input_shape "
                f"{tuple(input_shape)}"
            )
        embedding = hidden if embedding is None else embedding
        if tied and embedding != hidden:
            raise ValueError(
                f"lstm_lm: tied=true needs embedding == hidden, got embedding "
                f"{embedding} and hidden {hidden}; drop embedding= or set tied=false"
            )
        self.encoder = nn.Embedding(num_classes, embedding, device=device)
        self.rnns = nn.ModuleList(
            nn.LSTM(embedding if i == 0 else hidden, hidden, 1, batch_first=True, device=device)
            for i in range(layers)
        )
        self.drops = nn.ModuleList(SeededDropout(dropout) for _ in range(layers + 1))
        self.decoder = nn.Linear(hidden, num_classes, device=device)
        self.tied = bool(tied)
        if tied:
            self.decoder.weight = self.encoder.weight
        self.carry_state = False
        self._state: list = []  # per layer (h, c), each (1, streams, hidden), detached

    def reset_state(self) -> None:
        """Start every stream again from a zero hidden state."""
        self._state = []

    def get_state(self) -> list:
        """The carried hidden state as a flat list of tensors (empty: zero state)."""
        return [t.detach().clone() for pair in self._state for t in pair]

    def set_state(self, tensors) -> None:
        tensors = list(tensors)
        if len(tensors) not in (0, 2 * len(self.rnns)):
            raise ValueError(
                f"a hidden state of {len(tensors)} tensors for an LSTM of {len(self.rnns)} layers"
            )
        device = self.decoder.weight.device
        self._state = [
            (tensors[k].to(device), tensors[k + 1].to(device)) for k in range(0, len(tensors), 2)
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.drops[0](self.encoder(x.long()))
        carried = self._state if self.carry_state else []
        rows, state = x.shape[0], []
        for k, (rnn, drop) in enumerate(zip(self.rnns, self.drops[1:])):
            start = None
            if carried and carried[k][0].shape[1] >= rows:
                start = (carried[k][0][:, :rows].contiguous(), carried[k][1][:, :rows].contiguous())
            out, (h, c) = rnn(out, start)
            state.append((h.detach(), c.detach()))
            out = drop(out)
        if self.carry_state:
            self._state = state
        return self.decoder(out)


def init_zoo_module(module: nn.Module, generator: torch.Generator) -> set[int]:
    """Initialise one layer of a zoo model from `generator`, as Tao Lin's code does; the ids of
    the tensors it set (parameters and buffers).

    Conv2d: N(0, 2 / (k * k * out_channels)) (He, fan-out), no bias or a zero one; BatchNorm:
    weight 1, bias 0, running mean 0, variance 1 (Linear layers are left to the caller's
    PyTorch-default rule); the language model as a whole: embedding and decoder weights U(-0.1,
    0.1), decoder bias 0, LSTM weights U(+-1/sqrt(hidden)) (PyTorch's default).
    """
    done: set[int] = set()
    with torch.no_grad():
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            module.weight.normal_(0.0, math.sqrt(2.0 / fan_out), generator=generator)
            done.add(id(module.weight))
            if module.bias is not None:
                module.bias.zero_()
                done.add(id(module.bias))
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
            module.running_mean.zero_()
            module.running_var.fill_(1.0)
            module.num_batches_tracked.zero_()
            done.update(
                id(t)
                for t in (
                    module.weight,
                    module.bias,
                    module.running_mean,
                    module.running_var,
                    module.num_batches_tracked,
                )
            )
        elif isinstance(module, LSTMLanguageModel):  # its children too: the decoder's rule
            module.encoder.weight.uniform_(-0.1, 0.1, generator=generator)  # differs from Linear's
            if not module.tied:
                module.decoder.weight.uniform_(-0.1, 0.1, generator=generator)
            module.decoder.bias.zero_()
            bound = 1.0 / math.sqrt(module.rnns[0].hidden_size)
            for weight in module.rnns.parameters():
                weight.uniform_(-bound, bound, generator=generator)
            done.update(id(t) for t in module.parameters())
        elif isinstance(module, SeededDropout):
            seed = int(torch.randint(0, 2**62, (), generator=generator))
            module.rng_state.copy_(torch.Generator().manual_seed(seed).get_state())
            done.add(id(module.rng_state))
    return done
