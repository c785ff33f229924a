"""The benchmark's parameter sets: ResNet-20 and VGG-16 (CIFAR) shapes, and random tensors of them.

Only shapes: no model is built or trained, the benchmark gossips random tensors of these shapes.
"""

from __future__ import annotations

from typing import List, Tuple

MODELS = ("resnet20", "vgg16", "vgg16_bn")

Shapes = List[Tuple[str, Tuple[int, ...]]]


def resnet20_shapes() -> Shapes:
    """ResNet-20 for CIFAR (He et al. 2016): conv 3->16, three stages of three basic blocks (two 3x3
    convs each, no bias) with 16/32/64 channels, BatchNorm weight and bias (1-D) after every conv,
    parameter-free (option A) shortcuts, linear 64->10. 0.27 M parameters."""
    shapes: Shapes = [("conv1.weight", (16, 3, 3, 3)), ("bn1.weight", (16,)), ("bn1.bias", (16,))]
    inputs = 16
    for stage, channels in enumerate((16, 32, 64), start=1):
        for block in range(3):
            prefix = f"layer{stage}.{block}"
            for conv in (1, 2):
                shapes.append((f"{prefix}.conv{conv}.weight", (channels, inputs, 3, 3)))
                shapes.append((f"{prefix}.bn{conv}.weight", (channels,)))
                shapes.append((f"{prefix}.bn{conv}.bias", (channels,)))
                inputs = channels
    shapes += [("fc.weight", (10, 64)), ("fc.bias", (10,))]
    return shapes


VGG16_CONFIG = (
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


def vgg16_shapes(batch_norm: bool = False) -> Shapes:
    """VGG-16 for CIFAR-10: 13 3x3 convs 64..512 with biases, then the classifier 512->512->512->10
    with biases (the 32x32 input is 1x1 after five poolings). 15.2 M parameters. With batch_norm,
    a BatchNorm weight and bias (1-D) after every conv."""
    shapes: Shapes = []
    inputs, index = 3, 0
    for item in VGG16_CONFIG:
        if item == "M":
            continue
        shapes.append((f"features.{index}.weight", (item, inputs, 3, 3)))
        shapes.append((f"features.{index}.bias", (item,)))
        if batch_norm:
            shapes.append((f"features.{index}.bn.weight", (item,)))
            shapes.append((f"features.{index}.bn.bias", (item,)))
        inputs, index = item, index + 1
    for k, (fan_in, fan_out) in enumerate(((512, 512), (512, 512), (512, 10))):
        shapes.append((f"classifier.{k}.weight", (fan_out, fan_in)))
        shapes.append((f"classifier.{k}.bias", (fan_out,)))
    return shapes


def model_shapes(model: str) -> Shapes:
    """The named parameter set's (name, shape) list."""
    if model == "resnet20":
        return resnet20_shapes()
    if model == "vgg16":
        return vgg16_shapes()
    if model == "vgg16_bn":
        return vgg16_shapes(batch_norm=True)
    raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")


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
