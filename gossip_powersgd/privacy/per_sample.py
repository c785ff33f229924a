"""Per-example clipping without Opacus' hooks: ghost norms for Linear and Conv1d, vmap for the rest.

DP-SGD needs, per step, the clipped sum ``sum_i c_i g_i`` with ``c_i = min(1, C / |g_i|)``, where
``g_i`` is example i's gradient over all parameters. Materialising every ``g_i`` (Opacus' hooks)
costs a batch of weight-sized tensors per layer. For a layer ``out = a W^T`` the gradient of
example i is ``b_i^T a_i`` (``b`` the gradient at the layer's output, ``a`` its input), so:

* its squared norm is ``|a_i|^2 |b_i|^2`` for one position per example (a Linear on (N, d)
  inputs); for T positions (a sequence, or the T output positions of a convolution, whose input
  is unfolded, im2col) the per-example gradients ``b_i^T a_i`` are formed (cost T p q, and the
  clipped sum is then one more product; always for a convolution whose batch of them fits in
  `per_sample_layers.MATERIALISE_LIMIT` numbers: at cnn1d's sizes, batch 32, fewer operations
  beat fewer flops), or the Gram form ``sum_{t,s} (a_t.a_s + 1)(b_t.b_s)`` (cost T^2 (p + q),
  the 1 for the bias; ghost norm);
* the clipped sum is ``(c * b)^T a``: one weight-gradient product with the output gradients
  scaled per example (book-keeping, Bu et al. 2022; ghost clipping, Li et al. 2021).

So the backward pass computes only the gradients with respect to activations: Linear and Conv1d
run through a patched forward (`per_sample_layers._RecordedLayer.record`) that computes the
layer's output from detached parameters, keeps its input and retains the gradient of its output
(``retain_grad``: no Python runs during the backward, which a custom autograd function or a
tensor hook would cost per layer); a convolution runs its own kernel, and its input is unfolded
only after the backward (autograd through an unfolded input measured 3-5x slower), into memory
reused from step to step, with a row of ones so that one product per convolution gives the
weight's and the bias's per-example gradients together. Then
`PerSampleModule.clipped_sum` adds the norms and one product per weight, the Linear layers' all
in one function (`clip_rows`: at batch 32 issuing an operation costs about as much as computing
it). A trainable layer of any other type is recorded by a forward hook: GroupNorm and LayerNorm
have closed forms, the rest gets its per-example gradients from ``torch.func.vmap`` over ``vjp``
of that layer alone (``engine="vmap"`` sends every layer that way: the general engine, and the
measured reference). An in-place change of a recorded output (``ReLU(inplace=True)`` after a
Linear) is refused in one line: the retained gradient would be the changed tensor's.
Measured choices are in experiments/results/bench_dp.md.

The wrapped model keeps Opacus' parameter names (``_module.<name>``), so checkpoints of either
engine load into the other. A parameter shared by several layers (tied weights: an embedding and
the decoder that reuses its matrix) is refused in one line: each layer's records give its own
part of the example's gradient, and the norm of their sum needs the cross terms, which neither
engine forms. Opacus' hooks add the parts into one per-example gradient, so ``DPSGD``'s ``auto``
picks them for such a model (`shared_parameter`).
"""

from __future__ import annotations

import copy
from typing import Callable, List, Optional

import torch
from torch import nn

from gossip_powersgd.privacy.per_sample_general import _GeneralLayer
from gossip_powersgd.privacy.per_sample_layers import (
    _Conv1dLayer,
    _conv1d_supported,
    _Layer,
    _LinearLayer,
    _RecordedLayer,
    _State,
    clip_rows,
)


__all__ = ["PerSampleModule", "ENGINES", "shared_parameter"]

#: Engines of `PerSampleModule`: "ghost" (ghost norms for Linear and Conv1d, vmap for other
#: layers) and "vmap" (vmap for every layer).
ENGINES = ("ghost", "vmap")


def shared_parameter(module: nn.Module) -> Optional[str]:
    """How the first trainable parameter held by several layers is named (tied weights), or
    None: ``'enc.weight' of layers 'enc' (Embedding) and 'dec' (Linear)``."""
    owners = {}
    for name, sub in module.named_modules():
        for n, p in sub.named_parameters(recurse=False):
            if p.requires_grad:
                owners.setdefault(id(p), []).append((name, n, sub))
    for held in owners.values():
        if len(held) > 1:
            first = f"{held[0][0]}.{held[0][1]}" if held[0][0] else held[0][1]
            layers = [f"{name or '<root>'!r} ({type(sub).__name__})" for name, _, sub in held]
            return f"{first!r} of layers {', '.join(layers[:-1])} and {layers[-1]}"
    return None


class PerSampleModule(nn.Module):
    """``module`` with per-example clipping by `clipped_sum` after each backward (see module doc).

    The forward is the module's own; a backward leaves the private layers' ``.grad`` untouched
    and keeps what `clipped_sum` needs. ``loss_reduction="mean"``: the backward loss is the mean of
    the examples' losses (the trainer's), and the recorded gradients are scaled by the batch size.
    """

    def __init__(self, module: nn.Module, engine: str = "ghost", loss_reduction: str = "mean"):
        super().__init__()
        if engine not in ENGINES:
            raise ValueError(f"unknown per-example engine {engine!r}; choose one of {ENGINES}")
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        shared = shared_parameter(module)
        if shared is not None:
            raise ValueError(
                f"per-example gradients: the {engine} engine cannot clip a parameter shared by "
                f"several layers (tied weights), here {shared}; use engine='hooks' (Opacus), "
                "which engine='auto' picks for such a model"
            )
        self._module = module
        self.engine = engine
        self.loss_reduction = loss_reduction
        self.state = _State()
        self.layers: List[_Layer] = []
        self._patched: List[nn.Module] = []
        owner_of = {}
        for name, sub in module.named_modules():
            own = [n for n, p in sub.named_parameters(recurse=False) if p.requires_grad]
            if own:
                layer = self._layer(name, sub, own)
                self.layers.append(layer)
                for n in own:
                    owner_of[id(getattr(sub, n))] = (layer, n)
        #: (layer, index in its params, parameter) of each trainable one, in the model's order
        self.slots = [
            (owner_of[id(p)][0], owner_of[id(p)][0].params.index(owner_of[id(p)][1]), p)
            for p in module.parameters()
            if p.requires_grad
        ]
        #: The trainable parameters in the model's order: those `clipped_sum` returns sums for
        self.trainable = [p for _, _, p in self.slots]
        for layer in self.layers:  # where each of its parameters goes in `clipped_sum`'s list
            layer.outputs = [None] * len(layer.params)
        for position, (layer, index, _) in enumerate(self.slots):
            layer.outputs[index] = position
        self._recorded = [layer for layer in self.layers if isinstance(layer, _RecordedLayer)]
        self._general = [layer for layer in self.layers if isinstance(layer, _GeneralLayer)]

    def _layer(self, name: str, sub: nn.Module, own: List[str]) -> _Layer:
        label = f"{name or '<root>'!r} ({type(sub).__name__})"
        kind = None
        if self.engine == "ghost" and type(sub) is nn.Linear:
            kind = _LinearLayer
        elif self.engine == "ghost" and type(sub) is nn.Conv1d and _conv1d_supported(sub):
            kind = _Conv1dLayer
        if kind is None:
            if any(p.requires_grad for c in sub.children() for p in c.parameters()):
                raise ValueError(
                    f"per-example gradients: layer {label} has trainable parameters "
                    f"of its own and in its sub-layers; use engine='hooks' (Opacus)"
                )
            return _GeneralLayer(sub, own, self, label)
        layer = kind(sub, own, self, label)
        sub.forward = _recording_forward(sub, layer)
        self._patched.append(sub)
        return layer

    def __deepcopy__(self, memo) -> "PerSampleModule":
        """A copy of the module, wrapped anew. The patched forwards and hooks close over this
        wrapper's layers, which hold the original's parameters: copied as they are, the copy would
        compute with the original's parameters, whatever is loaded into it (the averaged model
        under DP was evaluated as the peer's own model that way). So the module is copied without
        them and wrapped again, with nothing recorded."""
        general = [layer for layer in self.layers if isinstance(layer, _GeneralLayer)]
        forwards = [sub.__dict__.pop("forward") for sub in self._patched]
        hooks = [layer.module._forward_hooks for layer in general]
        try:
            for layer, kept in zip(general, hooks):
                layer.module._forward_hooks = type(kept)(
                    (k, h) for k, h in kept.items() if k != layer.handle.id
                )
            module = copy.deepcopy(self._module, memo)
        finally:
            for sub, forward in zip(self._patched, forwards):
                sub.forward = forward
            for layer, kept in zip(general, hooks):
                layer.module._forward_hooks = kept
        wrapped = PerSampleModule(module, self.engine, self.loss_reduction)
        wrapped.train(self.training)
        memo[id(self)] = wrapped
        return wrapped

    def forward(self, *args, **kwargs):
        state = self.state
        state.passes += 1
        if state.recorded:  # an earlier forward's records were not consumed by `clipped_sum`
            for layer in self._recorded:
                layer.prune()  # those of a forward without backward hold memory for nothing
        return self._module(*args, **kwargs)

    def remove(self) -> None:
        """Undo the wrapping: the module's own forward again, no hooks."""
        for sub in self._patched:
            del sub.forward
        for layer in self.layers:
            if isinstance(layer, _GeneralLayer):
                layer.handle.remove()
        self._patched, self.layers, self.slots, self.trainable = [], [], [], []

    # ---- after backward ---------------------------------------------------------------------

    def _collect(self, batch: int):
        """Each layer's (a, b) of the uses the last backward reached (`_Layer.pairs`); checks
        that they come from one backward and hold ``batch`` examples. Returns the layers the
        backward reached: the Linear layers with one use of (B, p) inputs (`clip_rows` takes
        them together), and the others."""
        layers = self.layers
        for layer in layers:
            layer.pairs = layer.used()
        if len(self.state.seen) > 1:
            raise ValueError(
                "privatize found gradients of several forward/backward passes: "
                "call it after every backward (Poisson batches do not accumulate)"
            )
        rows, others = [], []
        for layer in layers:
            pairs = layer.pairs
            if not pairs:
                continue
            for pair in pairs:
                size = pair[1].shape[0]
                if size != batch:
                    raise ValueError(
                        f"privatize was told the batch has {batch} examples but the "
                        f"per-example gradients hold {size}: pass len(batch)"
                    )
            if layer.rows and len(pairs) == 1 and pairs[0][0].dim() == 2:
                rows.append(layer)
            else:
                others.append(layer)
        return rows, others

    def _scale(self, batch: int) -> float:
        return float(batch) if self.loss_reduction == "mean" else 1.0

    def per_example_gradients(self, batch: int) -> List[torch.Tensor]:
        """Each trainable parameter's per-example gradients, shape (batch, *p.shape) (zeros for a
        parameter the forward did not use); materialised, for checks. Keeps the records."""
        self._collect(batch)
        self.state.seen.clear()
        scale = self._scale(batch)
        with torch.no_grad():
            found = {id(layer): layer.per_example() for layer in self.layers if layer.pairs}
            out = []
            for layer, index, p in self.slots:
                g = found.get(id(layer), {}).get(layer.params[index])
                out.append(
                    torch.zeros((batch, *p.shape), dtype=p.dtype, device=p.device)
                    if g is None
                    else g.reshape(batch, *p.shape) * scale
                )
        return out

    def clipped_sum(
        self, max_norm: float, batch: int, norm_eps: float, divisor: float = 1.0
    ) -> List[torch.Tensor]:
        """The clipped sum ``sum_i c_i g_i`` per trainable parameter, divided by ``divisor``.

        ``c_i = min(1, C / (|g_i| + norm_eps))``, ``|g_i|`` over all trainable parameters
        together; the division is folded into the per-example weights. Clears what the backward
        recorded.
        """
        if torch.is_grad_enabled():  # `DPSGD.privatize` calls it with gradients off
            with torch.no_grad():
                return self.clipped_sum(max_norm, batch, norm_eps, divisor)
        rows, others = self._collect(batch)
        out: List[Optional[torch.Tensor]] = [None] * len(self.slots)
        if rows or others:
            squared = None
            for layer in others:
                part = layer.squared_norms()
                squared = part if squared is None else squared.add_(part)
            weights, sums = clip_rows(
                rows,
                squared,
                float(max_norm),
                self._scale(batch),
                float(norm_eps),
                float(divisor),
            )
            for layer, parts in zip(rows, sums):
                for position, part in zip(layer.outputs, parts):
                    out[position] = part
            for layer in others:
                clipped = layer.clipped(weights)
                for position, name, p in zip(layer.outputs, layer.params, layer.tensors):
                    out[position] = clipped[name].reshape(p.shape)
        for position, part in enumerate(out):
            if part is None:  # a parameter the forward did not use
                out[position] = torch.zeros_like(self.slots[position][2])
        self.clear()
        return out

    def clear(self) -> None:
        """Forget what the forward and backward passes recorded."""
        self.state.seen.clear()
        self.state.recorded = False
        for layer in self.layers:
            layer.clear()


def _recording_forward(module: nn.Module, layer: _RecordedLayer) -> Callable:
    """The module's forward through `_RecordedLayer.record` (which keeps what per-example
    clipping needs) in grad mode; the module's own forward otherwise (evaluation)."""
    own = type(module).forward
    conv = isinstance(module, nn.Conv1d)

    def forward(x):
        if not torch.is_grad_enabled():
            return own(module, x)
        if conv and x.dim() != 3:
            raise ValueError("per-example gradients: Conv1d needs batched (N, C, L) input")
        return layer.record(x)

    return forward
