"""Which models DP-SGD can train, and the layers swapped so that it can.

Per-example gradients need layers that process each example on its own. `validate_model` refuses,
in one line naming the layer and the two ways out, a layer that mixes the examples of a batch
(BatchNorm) or that Opacus cannot take; with ``dp_fix_model: true`` Opacus' validator replaces
such layers (BatchNorm -> GroupNorm: another model). A layer that updates floating buffers from
its input in training mode (``track_running_stats=True``: InstanceNorm, ...) is refused too, with
or without trainable parameters: its running statistics of the private batches are not noised, and
evaluation averages them over the peers (two peers: each learns the other's exactly). Only
building it with ``track_running_stats=False`` fixes that, so ``dp_fix_model`` does not apply.

Recurrent layers are swapped without asking: ``nn.LSTM`` and ``nn.GRU`` run as fused kernels that
per-example hooks cannot see into, and Opacus' ``DPLSTM`` / ``DPGRU`` compute the same function
with the same parameters (same names, same values: the ``nn.LSTM`` state dict loads into them) out
of linear layers whose per-example gradients Opacus' hooks record. The model is the same model, so
no key is needed; `DPSGD` then picks Opacus' hooks engine for it. Building them draws an
initialisation from torch's global RNG that the copied weights then overwrite: that draw runs
under a lock with the global RNG saved and restored, so peers that are threads of one process
(`LocalCluster`) neither perturb one another nor see a warning about it.

A LayerNorm without bias (``bias=False``) is trained as it is: Opacus' hooks engine gets a
LayerNorm grad sampler that takes it (`register_layer_norm_sampler`; Opacus 1.6's own reads the
missing bias and fails in the backward).
"""

from __future__ import annotations

import copy
import threading
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from gossip_powersgd.privacy.dependency import import_opacus
from gossip_powersgd.utils import one_line

__all__ = ["validate_model", "register_layer_norm_sampler", "SWAPPED_LAYERS"]

#: Layers replaced by their Opacus twin (same function, same parameters) whether or not
#: dp_fix_model is set.
SWAPPED_LAYERS = (nn.LSTM, nn.GRU)

#: The two ways out, named in every unsupported-layer error.
_FIXES = (
    "replace it with a layer Opacus supports (GroupNorm for BatchNorm), or set "
    "dp_fix_model: true to let Opacus' validator replace it"
)

_GLOBAL_RNG = threading.Lock()


def _build(fixer, module: nn.Module) -> nn.Module:
    """``fixer(module)`` with torch's global RNG left as it was (see the module docstring)."""
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        return fixer(module)


def _running_statistics_layer(model: nn.Module) -> Optional[str]:
    """The refusal of the first layer that keeps running statistics of its input, or None.

    PyTorch's normalisation layers say so by ``track_running_stats``: in training mode they update
    their floating buffers (``running_mean``, ``running_var``) from every batch they see. BatchNorm
    is left to `_first_bad_layer` (it also mixes the examples, and dp_fix_model replaces it).
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            continue
        if not getattr(module, "track_running_stats", False):
            continue
        floating = [b for b, v in module.named_buffers(recurse=False) if v.is_floating_point()]
        if floating:
            return (
                f"layer {name or '<root>'!r} ({type(module).__name__}) updates its buffers "
                f"{', '.join(floating)} from each private batch in training mode "
                "(track_running_stats=True), and the peers average them without noise: build it "
                "with track_running_stats=False"
            )
    return None


def _first_bad_layer(model: nn.Module) -> Optional[str]:
    """The problem of the first layer that cannot be trained per example, or None.

    Opacus' ModuleValidator looks only at layers with trainable parameters; a BatchNorm without
    affine weights mixes the examples of a batch just the same, so every BatchNorm is checked.
    """
    validators = import_opacus("opacus.validators.module_validator").ModuleValidator.VALIDATORS
    for name, module in model.named_modules():
        label = f"layer {name or '<root>'!r} ({type(module).__name__})"
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return f"{label} mixes the examples of a batch, so per-example gradients do not exist"
        trainable = any(p.requires_grad for p in module.parameters(recurse=False))
        if not trainable:
            continue
        errors = validators[type(module)](module) if type(module) in validators else []
        if errors:
            reason = str(errors[0]).strip().split(". ")[0].splitlines()[0].rstrip(".")
            return f"{label} is not supported by Opacus ({reason})"
        if any(True for _ in module.buffers(recurse=False)):
            return f"{label} keeps buffers computed from the data, which would not be private"
    return None


def register_layer_norm_sampler() -> None:
    """Give Opacus' hooks engine a LayerNorm grad sampler that takes a LayerNorm without bias
    (``bias=False``): Opacus 1.6's reads ``layer.bias.requires_grad`` and fails in the backward
    (AttributeError on None). With a bias, Opacus' own runs; without, the weight's per-example
    gradient is its closed form, as Opacus computes it (the normalised input times the output
    gradient, summed over all but the batch and the normalised dimensions). Registered once, by
    Opacus' documented ``register_grad_sampler``; later calls find it there."""
    grad_sample = import_opacus("opacus.grad_sample")
    opacus_own = grad_sample.GradSampleModule.GRAD_SAMPLERS.get(nn.LayerNorm)
    if opacus_own is None or getattr(opacus_own, "takes_no_bias", False):
        return
    keep_last = import_opacus("opacus.utils.tensor_utils").sum_over_all_but_batch_and_last_n

    def layer_norm(layer, activations, backprops):
        if layer.bias is not None:
            return opacus_own(layer, activations, backprops)
        # no bias: Opacus hooks only a layer with a trainable parameter, so the weight is one
        normed = F.layer_norm(activations[0], layer.normalized_shape, eps=layer.eps)
        return {layer.weight: keep_last(normed * backprops, layer.weight.dim())}

    layer_norm.takes_no_bias = True
    grad_sample.register_grad_sampler(nn.LayerNorm)(layer_norm)


def _fixed_copy(model: nn.Module, types=None) -> nn.Module:
    """Opacus' ``ModuleValidator.fix``, on a ``copy.deepcopy`` of ``model``.

    Opacus clones the model with torch.save and an unrestricted load (``weights_only=False``): it
    pickles the model, which fails for a class defined inside a function ("Can't pickle local
    object"), and unpickles it, which may run code. A deep copy needs neither; the layers are then
    replaced by Opacus' own fixers, exactly as its ``fix`` does (trainable layers with a registered
    fixer; only those of ``types`` when given).
    """
    fixers = import_opacus("opacus.validators.module_validator").ModuleValidator.FIXERS
    try:
        root = copy.deepcopy(model)
    except Exception as exc:  # noqa: BLE001 - whatever the model holds that cannot be copied
        raise ValueError(
            f"dp_fix_model cannot copy the model ({type(exc).__name__}: "
            f"{one_line(exc, limit=160)}): replace its unsupported layers by hand "
            "(GroupNorm instead of BatchNorm)"
        ) from None
    names = [
        name
        for name, module in root.named_modules()
        if type(module) in fixers
        and (types is None or type(module) in types)
        and any(p.requires_grad for p in module.parameters(recurse=False))
    ]
    for name in names:
        module = root.get_submodule(name)
        replacement = _build(fixers[type(module)], module)
        replacement.to(next(module.parameters()).device)
        if not name:
            root = replacement
            continue
        parent, _, child = name.rpartition(".")
        root.get_submodule(parent)._modules[child] = replacement
    return root


def _swap_recurrent(model: nn.Module) -> nn.Module:
    """``model``, or a copy with its `SWAPPED_LAYERS` replaced by their Opacus twins."""
    if not any(
        isinstance(m, SWAPPED_LAYERS) and any(p.requires_grad for p in m.parameters())
        for m in model.modules()
    ):
        return model
    return _fixed_copy(model, types=SWAPPED_LAYERS)


def validate_model(model: nn.Module, fix: bool = False) -> nn.Module:
    """``model`` if Opacus can compute its per-example gradients; a one-line ValueError if not.

    Recurrent layers (`SWAPPED_LAYERS`) are always swapped for their Opacus twins, in a copy
    (same function, same parameters). With ``fix=True`` a model with other unsupported layers is
    replaced by a copy in which Opacus' ``ModuleValidator.fix`` swapped them (BatchNorm ->
    GroupNorm, ...). Either way use the returned model, and build the optimizer on its
    parameters. A model with no trainable parameter is an error: nothing to privatize, and so is
    one with a layer that keeps running statistics of the data (`_running_statistics_layer`).
    """
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"differential privacy needs a model with trainable parameters; "
            f"{type(model).__name__} has none"
        )
    running = _running_statistics_layer(model)
    if running is not None:
        raise ValueError(running)
    model = _swap_recurrent(model)
    problem = _first_bad_layer(model)
    if problem is None:
        return model
    if not fix:
        raise ValueError(f"{problem}: {_FIXES}")
    fixed = _fixed_copy(model)
    left = _first_bad_layer(fixed)
    if left is not None:
        raise ValueError(
            f"{left}, and Opacus' validator cannot replace it: replace it by hand "
            f"(GroupNorm instead of BatchNorm)"
        )
    return fixed
