"""Models for the experiments, initialised deterministically from a seed.

Every peer builds its model from the same ``(spec, seed)`` and must get bit-identical initial
weights without communicating, and building a model must not disturb the global torch RNG (peers
are often threads of one process sharing that RNG). Built-in models are therefore constructed on
the ``meta`` device (which draws no random numbers), materialised on the CPU, and initialised
from a local ``torch.Generator`` with PyTorch's default scheme for each layer type.

Model specs (``build_model``)::

    "logreg"                     flatten -> Linear
    "mlp"  "mlp:100,100"         flatten -> (Linear -> ReLU) per hidden width -> Linear
    "cnn1d"  "cnn1d:channels=32" the MNIST-1D paper's CNN family:
                                 3 x (Conv1d(k=5, s=2, p=1) -> ReLU) -> flatten -> Linear
    "resnet20"  "resnet20:width=16"
                                 the CIFAR ResNet-20 of the PowerGossip / Choco-SGD experiments
                                 (272,474 parameters at width 16 for 10 classes); image inputs
    "vgg16"  "vgg16:bn=false,width=64,dropout=0.5"
                                 VGG-16 for 32x32 images, with BatchNorm unless bn=false
    "lstm_lm"  "lstm_lm:layers=3,hidden=650,tied=true,dropout=0.4,embedding=650"
                                 an LSTM language model over token sequences; its "classes" are
                                 the vocabulary (defaults: 2 layers, 200 hidden, tied, dropout 0.2)
    "package.module:callable"    bring your own: callable(input_shape=..., num_classes=...) or
                                 callable(); must return an nn.Module
    "package.module:callable:width=32,bn=true"
                                 the same, called with keyword options too; a value that reads
                                 as an integer, a number or true/false is passed as one, any other
                                 as a string

The zoo models (`zoo.py`) are initialised as in the paper's code (He-normal convolutions,
BatchNorm at 1/0), the others with PyTorch's default rule for each layer type.
"""

from __future__ import annotations

import math
import threading
from typing import Optional, Sequence

import torch
from torch import nn

from ..specs import (
    FALSE_WORDS,
    TRUE_WORDS,
    UserCodeExit,
    accepts,
    import_object,
    parse_items,
    parse_spec,
    spec_error,
    split_name,
    unknown_name,
    user_code,
)
from ..utils import available_memory, one_line
from .architectures import MODELS, WHAT, CNN1d  # noqa: F401 (CNN1d: re-exported)
from .zoo import init_zoo_module

__all__ = [
    "build_model",
    "check_model_fits",
    "check_single_sample_batch",
    "count_parameters",
    "has_batch_norm",
    "CNN1d",
    "MODEL_NAMES",  # noqa: F822 (module __getattr__: the registered models)
]


def __getattr__(name: str):
    """`MODEL_NAMES`: how each registered model (`architectures.MODELS`) and a bring-your-own one
    are spelled, read when asked (a model registered later is listed too)."""
    if name == "MODEL_NAMES":
        return MODELS.accepted()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_fits_in_memory(spec: str, model: nn.Module) -> None:
    """Refuse, before anything is allocated, a model (still on the meta device) whose parameters
    alone exceed the memory this machine has free: it would fail as an allocation error deep in
    torch (training needs several times this: gradients, optimizer state, gossip buffers)."""
    count = count_parameters(model)
    size = sum(
        p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()
    )
    size += sum(b.numel() * b.element_size() for b in model.buffers())
    free = available_memory()
    if free is not None and size > free:
        raise ValueError(
            f"model spec {spec!r} has {count:,} parameters ({size / 1e9:.4g} GB), more than the "
            f"{free / 1e9:.4g} GB of memory this machine has free: it would run out of memory "
            "before the first step; use a smaller model"
        )


def _materialize(module: nn.Module) -> None:
    """Give every meta-device parameter real (uninitialised) CPU storage, in place.

    ``Module.to_empty`` would do this too, but on the meta device it goes through
    ``torch.empty_like``, whose first call imports sympy (seconds of start-up per process).
    """
    fresh_of: dict[int, nn.Parameter] = {}  # a tied parameter stays one parameter
    for layer in module.modules():
        for name, param in layer.named_parameters(recurse=False):
            if id(param) not in fresh_of:
                fresh = torch.empty(param.shape, dtype=param.dtype, device="cpu")
                fresh_of[id(param)] = nn.Parameter(fresh, requires_grad=param.requires_grad)
            setattr(layer, name, fresh_of[id(param)])
        for name, buffer in layer.named_buffers(recurse=False):
            if buffer is not None and buffer.is_meta:
                layer.register_buffer(
                    name,
                    torch.empty(buffer.shape, dtype=buffer.dtype),
                    persistent=name not in layer._non_persistent_buffers_set,
                )


def _init_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default Linear/Conv initialisation, drawn from ``generator``.

    ``kaiming_uniform_(a=sqrt(5))`` on the weight and the bias rule of ``reset_parameters`` both
    reduce to U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    """
    initialised: set[int] = set()
    for layer in module.modules():  # pre-order: a zoo model's own rule comes before its layers'
        if any(id(p) in initialised for p in layer.parameters(recurse=False)):
            continue
        initialised |= init_zoo_module(layer, generator)
        if isinstance(layer, (nn.Linear, nn.Conv1d)) and id(layer.weight) not in initialised:
            bound = 1.0 / math.sqrt(layer.weight[0].numel())
            with torch.no_grad():
                layer.weight.uniform_(-bound, bound, generator=generator)
                initialised.add(id(layer.weight))
                if layer.bias is not None:
                    layer.bias.uniform_(-bound, bound, generator=generator)
                    initialised.add(id(layer.bias))
    # _materialize leaves garbage in memory; never hand out a tensor we did not initialise.
    missed = [
        name
        for name, p in [*module.named_parameters(), *module.named_buffers()]
        if id(p) not in initialised
    ]
    if missed:
        raise RuntimeError(f"no initialiser for parameters or buffers {missed}")


# Bring-your-own constructors draw from the global RNG; we seed it temporarily and restore it, and
# the lock keeps two peers' threads from seeding it at the same time.
_GLOBAL_RNG_LOCK = threading.Lock()


def _literal(text: str):
    """A bring-your-own option's value: an int, a float or a bool where it reads as one."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.lower() in TRUE_WORDS + FALSE_WORDS:
        return text.lower() in TRUE_WORDS
    return text


def byo_options(spec: str) -> tuple[str, dict]:
    """``"pkg.mod:fn:width=32,bn=true"`` -> ``("pkg.mod:fn", {"width": 32, "bn": True})``."""
    module, rest = split_name(spec)
    attr, sep, text = (rest or "").partition(":")
    if not sep:
        return spec, {}
    positional, raw = parse_items(text, WHAT, spec)  # the one spec grammar
    if positional:
        raise spec_error(WHAT, spec, f"option {positional[0]!r} is not key=value")
    return f"{module}:{attr.strip()}", {k: _literal(v) for k, v in raw.items()}


def _byo_model(spec, input_shape, num_classes, seed) -> nn.Module:
    target, options = byo_options(spec)
    factory = import_object(target, MODELS.accepted())
    for key in options:
        if not accepts(factory, key):
            raise ValueError(
                f"model spec {spec!r}: {target} takes no keyword argument {key!r}; drop the "
                "option or add the argument"
            )
    with_shapes = accepts(factory, "input_shape") and accepts(factory, "num_classes")
    shapes = dict(input_shape=tuple(input_shape), num_classes=num_classes) if with_shapes else {}
    with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # CPU only: leave CUDA RNGs alone
        try:
            with user_code(spec, "calling it"):
                model = factory(**shapes, **options)
        except UserCodeExit:
            raise
        except Exception as exc:
            raise ValueError(
                f"model spec {spec!r}: calling it raised {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model spec {spec!r}: must return a torch.nn.Module, got {type(model).__name__}"
        )
    tensors = list(model.parameters()) + list(model.buffers())
    if any(t.is_meta for t in tensors):
        raise ValueError(
            f"model spec {spec!r}: the model has parameters or buffers on the meta device (no "
            "data to train); build it on the CPU"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"model spec {spec!r}: the model has no trainable parameter (none, or every one has "
            "requires_grad=False); leave at least one unfrozen"
        )
    return model


def check_model_fits(
    model: nn.Module, spec: str, x_sample: torch.Tensor, num_classes: int, target_shape: tuple = ()
) -> None:
    """Run `model` once on `x_sample` (a few of the dataset's inputs) and check it returns
    (samples, *target_shape, num_classes) logits (`target_shape`: a sample's targets, e.g. one per
    token of a language model's sequence); a one-line ValueError says what does not fit.

    Eval mode without gradients, so nothing about the model changes (no BatchNorm statistics).
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), user_code(spec, "running the model on the dataset's inputs"):
            out = model(x_sample)
    except UserCodeExit:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the model raises is a mismatch with the data
        raise ValueError(
            f"model {spec!r} cannot run on this dataset's inputs (shape "
            f"{tuple(x_sample.shape[1:])}, {x_sample.dtype}): "
            f"{type(exc).__name__}: {one_line(exc, limit=300)}; build it for inputs of "
            "that shape and dtype"
        ) from None
    finally:
        model.train(was_training)
    wanted = (len(x_sample), *target_shape, num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != wanted:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"model {spec!r} returns {got} for {len(x_sample)} inputs; it must "
            f"return logits of shape {wanted} (one per class)"
        )


def has_batch_norm(model: nn.Module) -> bool:
    """Whether `model` holds a BatchNorm layer (which cannot train on a batch of one sample)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def check_single_sample_batch(
    model: nn.Module,
    spec: str,
    x_one: torch.Tensor,
    *,
    rank: int,
    shard_size: Optional[int],
    batch_size: int,
) -> None:
    """The last batch of this peer's shard holds one sample (`x_one`): check `model` trains on it.

    A copy of the model takes the forward pass in training mode, so the model itself is untouched.
    BatchNorm over a single value per channel fails there; the error says how to avoid the batch.
    `shard_size` None: the size is private (the error reaches every peer) and is not named.
    """
    import copy

    trial = copy.deepcopy(model).train()
    try:
        with user_code(spec, "training the model on one sample"):
            trial(x_one)
    except UserCodeExit:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ValueError(
            f"model {spec!r} cannot train on a batch of 1 sample ({one_line(exc, limit=300)}), "
            f"and rank {rank}'s shard"
            + (" (its size private)" if shard_size is None else f" of {shard_size} samples")
            + f" ends in one at batch_size {batch_size}; change batch_size (e.g. to "
            f"{batch_size + 1}) "
            "or drop a training sample so that the last batch is not a single "
            "sample"
        ) from None


def build_model(
    spec: str, input_shape: Sequence[int], num_classes: int, seed: int = 0
) -> nn.Module:
    """Build the model named by ``spec`` on the CPU, initialised deterministically from ``seed``.

    The same ``(spec, input_shape, num_classes, seed)`` always gives identical parameters, and the
    global torch RNG state is left untouched. Bring-your-own constructors run with the global CPU
    RNG temporarily seeded from ``seed`` (so they are deterministic too, as long as no other
    thread draws from the global RNG meanwhile); they should build on the CPU.
    """
    input_shape = tuple(int(s) for s in input_shape)
    if not input_shape or min(input_shape) < 1:
        raise ValueError(
            f"input_shape must be a non-empty tuple of positive sizes, got {input_shape}"
        )
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    parsed = parse_spec(spec, WHAT)  # the one spec grammar (topologies.grammar via specs)
    if parsed.name in MODELS:
        model = MODELS.get(parsed.name).build(spec, parsed, input_shape, num_classes, "meta")
        _check_fits_in_memory(spec, model)
        _materialize(model)
        _init_parameters(model, torch.Generator(device="cpu").manual_seed(int(seed)))
        return model
    if ":" in spec:  # anything else with a colon is "package.module:function[:options]"
        return _byo_model(spec, input_shape, num_classes, int(seed))
    raise unknown_name(WHAT, spec, parsed.name, MODELS.accepted())


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters())
