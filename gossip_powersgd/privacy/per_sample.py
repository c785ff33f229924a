"""Per-example clipping without Opacus' hooks: ghost norms for Linear and Conv1d, vmap for the rest.

DP-SGD needs, per step, the clipped sum ``sum_i c_i g_i`` with ``c_i = min(1, C / |g_i|)``, where
``g_i`` is example i's gradient over all parameters. Materialising every ``g_i`` (Opacus' hooks)
costs a batch of weight-sized tensors per layer. For a layer ``out = a W^T`` the gradient of
example i is ``b_i^T a_i`` (``b`` the gradient at the layer's output, ``a`` its input), so:

* its squared norm is ``|a_i|^2 |b_i|^2`` for one position per example, and
  ``sum((a_i a_i^T) * (b_i b_i^T))`` (Gram matrices, cost T^2) for T positions (a sequence, or the
  T output positions of a convolution after unfolding its input, im2col); when T is large against
  the layer's width the per-example gradients themselves are cheaper, and the layer uses them;
* the clipped sum is ``(c * b)^T a``: one ordinary weight-gradient product with the output
  gradients scaled per example (book-keeping, Bu et al. 2022; ghost clipping, Li et al. 2021).

So the backward pass computes only the gradients with respect to activations (each supported
layer runs through `_Recorded`, which keeps ``(a, b)`` and returns no weight gradient), and
`PerSampleModule.clipped_sum` adds the norms and one product per weight. A trainable layer of any
other type is recorded by a forward hook and its per-example gradients come from
``torch.func.vmap`` over ``vjp`` of that layer alone (``engine="vmap"`` sends every layer that way;
it is the general engine, and the measured reference for the ghost one).

The wrapped model keeps Opacus' parameter names (``_module.<name>``), so checkpoints of either
engine load into the other.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["PerSampleModule", "ENGINES"]

#: Engines of `PerSampleModule`: "ghost" (ghost norms for Linear and Conv1d, vmap for other
#: layers) and "vmap" (vmap for every layer).
ENGINES = ("ghost", "vmap")


def _cat(parts: List[torch.Tensor]) -> torch.Tensor:
    """Several uses of one layer in a forward, as more positions (no copy for a single use)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


class _Recorded(torch.autograd.Function):
    """``forward(x)`` of a Linear or Conv1d layer whose backward keeps (input, output gradient)
    for the layer's `_Layer` and returns the input's gradient only (the weights get none: their
    private gradient is `PerSampleModule.clipped_sum`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        ctx.layer, ctx.pass_id = layer, layer.owner.passes
        ctx.save_for_backward(x, weight)
        return layer.compute(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        ctx.layer.add(ctx.pass_id, (x, grad_out))
        grad_x = ctx.layer.input_gradient(x, weight, grad_out) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


class _Layer:
    """One trainable layer: what it recorded in the last backward, and its per-example pieces.

    ``rows(batch)`` returns per example the layer's input and output gradient as
    ``(a, b)`` of shapes (B, T, p) and (B, T, q), T positions (several uses of the layer add
    positions: their gradients add up, as positions' do). The weight gradient is ``b^T a``.
    """

    def __init__(self, module: nn.Module, params: Sequence[str], owner: "PerSampleModule"):
        self.module = module
        self.params = list(params)  # trainable direct parameters, in the model's order
        self.owner = owner
        self.records: list = []

    def add(self, pass_id: int, record: tuple) -> None:
        """Keep one use's (input, output gradient), noting which forward pass it belongs to."""
        self.owner.seen.add(pass_id)
        self.records.append(record)

    def clear(self) -> None:
        self.records = []


class _LinearLayer(_Layer):
    """nn.Linear, input (B, ..., p): every middle position of an example is a position."""

    def compute(self, x, weight, bias):
        return F.linear(x, weight, bias)

    def input_gradient(self, x, weight, grad_out):
        return grad_out @ weight

    def _rows(self):
        """(a, b) as (B, p) and (B, q) for one position per example, else (B, T, p), (B, T, q)."""
        if len(self.records) == 1 and self.records[0][0].dim() == 2:
            return self.records[0]
        return (_cat([x.reshape(x.shape[0], -1, x.shape[-1]) for x, _ in self.records]),
                _cat([g.reshape(g.shape[0], -1, g.shape[-1]) for _, g in self.records]))

    def squared_norms(self) -> torch.Tensor:
        a, b = self._rows()
        has_w, has_b = "weight" in self.params, "bias" in self.params
        if a.dim() == 2:  # |g_i|^2 = |a_i|^2 |b_i|^2 for the weight, |b_i|^2 for the bias
            b2 = torch.linalg.vecdot(b, b)
            if not has_w:
                return b2
            a2 = torch.linalg.vecdot(a, a)
            return torch.addcmul(b2, a2, b2) if has_b else a2 * b2
        # Positions: the weight's gradient is sum_t b_t a_t^T; Gram matrices or the gradients
        return _sequence_norms(a.transpose(1, 2), b.transpose(1, 2), has_w, has_b)[0]

    def clipped(self, weights: torch.Tensor) -> dict:
        a, b = self._rows()
        scaled = b * weights.view(-1, *[1] * (b.dim() - 1))
        out = {}
        if "weight" in self.params:
            out["weight"] = scaled.reshape(-1, b.shape[-1]).t() @ a.reshape(-1, a.shape[-1])
        if "bias" in self.params:
            out["bias"] = scaled.reshape(-1, b.shape[-1]).sum(0)
        return out

    def per_example(self) -> dict:
        a, b = self._rows()
        if a.dim() == 2:
            a, b = a.unsqueeze(1), b.unsqueeze(1)
        return {"weight": torch.bmm(b.transpose(1, 2), a), "bias": b.sum(1)}


class _Conv1dLayer(_Layer):
    """nn.Conv1d (one group, zero padding): the unfolded input (im2col) is ``a``."""

    def compute(self, x, weight, bias):
        m = self.module
        return F.conv1d(x, weight, bias, m.stride, m.padding, m.dilation, m.groups)

    def input_gradient(self, x, weight, grad_out):
        m = self.module
        return torch.nn.grad.conv1d_input(x.shape, weight, grad_out, m.stride, m.padding,
                                          m.dilation, m.groups)

    def _unfold(self, x: torch.Tensor) -> torch.Tensor:
        """im2col by a strided view of the padded input: (B, C_in k, T), weight's column order."""
        m = self.module
        (k,), (d,), (s,), (p,) = m.kernel_size, m.dilation, m.stride, m.padding
        if p:
            x = F.pad(x, (p, p))
        cols = x.unfold(2, d * (k - 1) + 1, s)  # (B, C_in, T, span)
        if d > 1:
            cols = cols[..., ::d]
        # contiguous: with one input channel the reshape is a strided view, slow in products
        return cols.permute(0, 1, 3, 2).reshape(x.shape[0], -1, cols.shape[2]).contiguous()

    def _columns(self):
        """(a, b) as (B, C_in k, T) and (B, C_out, T); several uses add positions."""
        a = [self._unfold(x) for x, _ in self.records]
        b = [g for _, g in self.records]
        return (a[0], b[0]) if len(a) == 1 else (torch.cat(a, 2), torch.cat(b, 2))

    def squared_norms(self) -> torch.Tensor:
        a, b = self._columns()
        squared, grads, totals = _sequence_norms(a, b, "weight" in self.params,
                                                 "bias" in self.params)
        self.cache = (a, b, grads, totals)
        return squared

    def clipped(self, weights: torch.Tensor) -> dict:
        """Batched products on the unfolded input (faster than the convolution's own
        weight-gradient kernel at these sizes), or the per-example gradients when made."""
        a, b, grads, totals = self.cache
        out = {}
        if "weight" in self.params:
            total = torch.mv(grads.t(), weights) if grads is not None \
                else torch.bmm(b * weights.view(-1, 1, 1), a.transpose(1, 2)).sum(0)
            out["weight"] = total.reshape(self.module.weight.shape)
        if "bias" in self.params:
            out["bias"] = torch.mv((b.sum(2) if totals is None else totals).t(), weights)
        return out

    def clear(self) -> None:
        self.records, self.cache = [], None

    def per_example(self) -> dict:
        a, b = self._columns()
        grads = torch.bmm(b, a.transpose(1, 2))
        return {"weight": grads.reshape(len(b), *self.module.weight.shape), "bias": b.sum(2)}


#: Per-example weight gradients are materialised when a layer's batch of them holds at most this
#: many numbers (64 MiB in float32); above, the Gram form keeps memory at T^2 per example.
MATERIALISE_LIMIT = 1 << 24


def _sequence_norms(a: torch.Tensor, b: torch.Tensor, has_w: bool, has_b: bool):
    """Per example |sum_t b_t a_t^T|^2 (+ |sum_t b_t|^2 with a bias), a: (B, p, T), b: (B, q, T).

    The per-example gradients cost T p q to form, and then give the clipped sum for p q more;
    the Gram form sum_{t,s} (a_t.a_s + 1)(b_t.b_s) costs T^2 (p + q), but the clipped sum then
    needs a product of T p q anyway. So the gradients are formed unless they would not fit in
    `MATERIALISE_LIMIT`. Returns (squared norms, the per-example weight gradients flattened or
    None, the per-example bias gradients or None) for the clipped sum.
    """
    p, q = a.shape[1], b.shape[1]
    if not has_w:
        totals = b.sum(2)
        return torch.linalg.vecdot(totals, totals), None, totals
    if len(a) * p * q > MATERIALISE_LIMIT:
        gram_a = torch.bmm(a.transpose(1, 2), a)
        if has_b:
            gram_a += 1
        gram_b = torch.bmm(b.transpose(1, 2), b)
        return torch.linalg.vecdot(gram_a.flatten(1), gram_b.flatten(1)), None, None
    grads = torch.bmm(b, a.transpose(1, 2)).flatten(1)
    squared = torch.linalg.vecdot(grads, grads)
    totals = None
    if has_b:
        totals = b.sum(2)
        squared += torch.linalg.vecdot(totals, totals)
    return squared, grads, totals


def _conv1d_supported(module: nn.Conv1d) -> bool:
    return (module.groups == 1 and module.padding_mode == "zeros"
            and not isinstance(module.padding, str))


class _GeneralLayer(_Layer):
    """Any other layer with its own trainable parameters: per-example gradients by vmap(vjp).

    A forward hook keeps the layer's inputs and, at backward, the gradient at its output; the
    layer is then differentiated alone, one example at a time under ``torch.func.vmap``. Needs a
    layer that takes tensors (batch first) and returns one tensor, like every torch.nn layer
    that treats examples independently.
    """

    def __init__(self, module, params, owner: "PerSampleModule", label: str):
        super().__init__(module, params, owner)
        self.label = label
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        if self.owner.computing or not torch.is_grad_enabled():
            return
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"per-example gradients: layer {self.label} returns "
                             f"{type(out).__name__}, not one tensor; use engine='hooks' (Opacus)")
        if out.requires_grad:
            pass_id = self.owner.passes
            out.register_hook(lambda g: self.add(pass_id, (args, g)))

    def per_example(self) -> dict:
        """This layer's per-example gradients, one (B, *shape) tensor per parameter."""
        self.owner.computing = True  # its own forward hook must not record the vmap's calls
        try:
            return self._per_example()
        finally:
            self.owner.computing = False

    def squared_norms(self) -> torch.Tensor:
        self.grads = self.per_example()
        return sum(torch.linalg.vecdot(g.flatten(1), g.flatten(1)) for g in self.grads.values())

    def clipped(self, weights: torch.Tensor) -> dict:
        return {n: torch.einsum("i,i...->...", weights.to(g.dtype), g)
                for n, g in self.grads.items()}

    def clear(self) -> None:
        self.records, self.grads = [], {}

    def _per_example(self) -> dict:
        if isinstance(self.module, (nn.GroupNorm, nn.LayerNorm)):
            return self._norm_per_example()
        params = {n: getattr(self.module, n).detach() for n in self.params}
        total = None
        for args, grad_out in self.records:
            dims = tuple(0 if isinstance(a, torch.Tensor) else None for a in args)

            def one(p, xs, g):
                inputs = tuple(x.unsqueeze(0) if isinstance(x, torch.Tensor) else x for x in xs)
                _, pullback = torch.func.vjp(
                    lambda q: torch.func.functional_call(self.module, q, inputs), p)
                return pullback(g.unsqueeze(0))[0]

            grads = torch.func.vmap(one, in_dims=(None, dims, 0))(params, args, grad_out)
            total = grads if total is None else {n: total[n] + grads[n] for n in grads}
        return total


    def _norm_per_example(self) -> dict:
        """GroupNorm and LayerNorm in closed form: the affine weight's gradient is the normalised
        input times the output gradient, summed over the positions (vmap would run them on a
        batch of one, which GroupNorm with one value per group refuses)."""
        m = self.module
        total = {}
        for (x, *_), g in self.records:
            if isinstance(m, nn.GroupNorm):
                normed, dims = F.group_norm(x, m.num_groups, eps=m.eps), list(range(2, x.dim()))
            else:
                normed = F.layer_norm(x, m.normalized_shape, eps=m.eps)
                dims = list(range(1, x.dim() - len(m.normalized_shape)))
            grads = {"weight": (normed * g).sum(dims) if dims else normed * g,
                     "bias": g.sum(dims) if dims else g}
            for n in self.params:
                total[n] = grads[n] if n not in total else total[n] + grads[n]
        return total


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
        self._module = module
        self.engine = engine
        self.loss_reduction = loss_reduction
        self.computing = False
        self.passes = 0  # forward passes so far; what the backward recorded is tagged with it
        self.seen: set = set()  # the passes whose backward has recorded something
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
        #: (layer, attribute) of each trainable parameter, in ``module.parameters()`` order
        self.slots = [owner_of[id(p)] for p in module.parameters() if p.requires_grad]

    def _layer(self, name: str, sub: nn.Module, own: List[str]) -> _Layer:
        label = f"{name or '<root>'!r} ({type(sub).__name__})"
        kind = None
        if self.engine == "ghost" and type(sub) is nn.Linear:
            kind = _LinearLayer
        elif self.engine == "ghost" and type(sub) is nn.Conv1d and _conv1d_supported(sub):
            kind = _Conv1dLayer
        if kind is None:
            if any(p.requires_grad for c in sub.children() for p in c.parameters()):
                raise ValueError(f"per-example gradients: layer {label} has trainable parameters "
                                 f"of its own and in its sub-layers; use engine='hooks' (Opacus)")
            return _GeneralLayer(sub, own, self, label)
        layer = kind(sub, own, self)
        sub.forward = _recording_forward(sub, layer)
        self._patched.append(sub)
        return layer

    def forward(self, *args, **kwargs):
        self.passes += 1
        return self._module(*args, **kwargs)

    def remove(self) -> None:
        """Undo the wrapping: the module's own forward again, no hooks."""
        for sub in self._patched:
            del sub.forward
        for layer in self.layers:
            if isinstance(layer, _GeneralLayer):
                layer.handle.remove()
        self._patched, self.layers, self.slots = [], [], []

    # ---- after backward ---------------------------------------------------------------------

    def _check(self, batch: int) -> None:
        if len(self.seen) > 1:
            raise ValueError("privatize found gradients of several forward/backward passes: "
                             "call it after every backward (Poisson batches do not accumulate)")
        for layer in self.layers:
            for record in layer.records:
                size = record[1].shape[0]
                if size != batch:
                    raise ValueError(f"privatize was told the batch has {batch} examples but the "
                                     f"per-example gradients hold {size}: pass len(batch)")

    def _scale(self, batch: int) -> float:
        return float(batch) if self.loss_reduction == "mean" else 1.0

    def per_example_gradients(self, batch: int) -> List[torch.Tensor]:
        """Each trainable parameter's per-example gradients, shape (batch, *p.shape) (zeros for a
        parameter the forward did not use); materialised, for checks. Keeps the records."""
        self._check(batch)
        scale = self._scale(batch)
        with torch.no_grad():
            found = {id(layer): layer.per_example() for layer in self.layers if layer.records}
            out = []
            for layer, n in self.slots:
                p = getattr(layer.module, n)
                g = found.get(id(layer), {}).get(n)
                out.append(torch.zeros((batch, *p.shape), dtype=p.dtype, device=p.device)
                           if g is None else g.reshape(batch, *p.shape) * scale)
        return out

    def clipped_sum(self, max_norm: float, batch: int,
                    norm_eps: float) -> tuple[List[torch.Tensor], torch.Tensor]:
        """The clipped sum ``sum_i c_i g_i`` per trainable parameter, and the factors ``c``.

        ``c_i = min(1, C / (|g_i| + norm_eps))``, ``|g_i|`` over all trainable parameters
        together. Clears what the backward recorded.
        """
        self._check(batch)
        scale = self._scale(batch)
        used = [layer for layer in self.layers if layer.records]
        with torch.no_grad():
            squared = None
            for layer in used:
                part = layer.squared_norms()
                squared = part if squared is None else squared.add_(part)
            if squared is None:
                squared = torch.zeros(batch)
            norms = squared.sqrt_().mul_(scale)
            factors = norms.add_(norm_eps).reciprocal_().mul_(max_norm).clamp_(max=1.0)
            weights = factors * scale
            found = {id(layer): layer.clipped(weights) for layer in used}
            out = []
            for layer, n in self.slots:
                p = getattr(layer.module, n)
                total = found.get(id(layer), {}).get(n)
                out.append(torch.zeros_like(p) if total is None else total.reshape(p.shape))
        self.clear()
        return out, factors

    def clear(self) -> None:
        """Forget what the backward passes recorded."""
        self.seen = set()
        for layer in self.layers:
            layer.clear()


def _recording_forward(module: nn.Module, layer: _Layer) -> Callable:
    """The module's forward through `_Recorded` (which keeps what per-example clipping needs)."""

    def forward(x):
        if isinstance(module, nn.Conv1d) and x.dim() != 3:
            raise ValueError("per-example gradients: Conv1d needs batched (N, C, L) input")
        return _Recorded.apply(x, module.weight, module.bias, layer)

    return forward
