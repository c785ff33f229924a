"""The benchmark's parameter sets: the parameter shapes of the zoo's ResNet-20 and VGG-16 for
CIFAR-10 (`gossip_powersgd.training.zoo`, the one home of those architectures), and random
tensors of them.

Only shapes: the models are built on the meta device (no memory, no initialisation) to read their
parameters' names and shapes; the benchmark gossips random tensors of these shapes.
"""

from __future__ import annotations

import functools
from typing import List, Tuple

MODELS = ("resnet20", "vgg16", "vgg16_bn")
#: The inputs the parameter sets are built for: CIFAR-10 (3 x 32 x 32 images, 10 classes).
CIFAR_INPUT, CIFAR_CLASSES = (3, 32, 32), 10

Shapes = List[Tuple[str, Tuple[int, ...]]]


@functools.lru_cache(maxsize=None)
def _zoo_shapes(model: str) -> Tuple[Tuple[str, Tuple[int, ...]], ...]:
    from gossip_powersgd.training.zoo import VGG16, ResNet20

    if model == "resnet20":
        module = ResNet20(CIFAR_INPUT, CIFAR_CLASSES, device="meta")
    elif model in ("vgg16", "vgg16_bn"):
        module = VGG16(CIFAR_INPUT, CIFAR_CLASSES, batch_norm=model == "vgg16_bn", device="meta")
    else:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    return tuple((name, tuple(p.shape)) for name, p in module.named_parameters())


def resnet20_shapes() -> Shapes:
    """The zoo's ResNet-20 (`zoo.ResNet20`, the PowerGossip paper's CIFAR ResNet): conv 3->16,
    three stages of three basic blocks (two 3x3 convs each, no bias) with 16/32/64 channels,
    BatchNorm weight and bias (1-D) after every conv, 1x1-conv + BatchNorm shortcuts where the shape
    changes, linear 64->10. 0.27 M parameters."""
    return list(_zoo_shapes("resnet20"))


def vgg16_shapes(batch_norm: bool = False) -> Shapes:
    """The zoo's VGG-16 for CIFAR-10 (`zoo.VGG16`): 13 3x3 convs 64..512, then the classifier
    512->512->512->10 with biases (the 32x32 input is 1x1 after five poolings). 15.2 M parameters.
    Without batch_norm the convs have biases; with it, a BatchNorm weight and bias (1-D) follow
    every conv and the convs have none."""
    return list(_zoo_shapes("vgg16_bn" if batch_norm else "vgg16"))


def model_shapes(model: str) -> Shapes:
    """The named parameter set's (name, shape) list."""
    return list(_zoo_shapes(model))


def make_params(shapes: Shapes, rank: int, seed: int = 0):
    """Random float32 tensors of the given shapes, different on every peer (std 1/sqrt(fan-in))."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    tensors = []
    for _, shape in shapes:
        fan_in = max(1, int(torch.Size(shape[1:]).numel()))
        tensors.append(torch.randn(shape, generator=generator).mul_(fan_in**-0.5))
    return tensors


def count_params(shapes: Shapes) -> int:
    """Scalars in a parameter set."""
    total = 0
    for _, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total
