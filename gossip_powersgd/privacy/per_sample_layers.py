"""The layers of per-example clipping (`per_sample.PerSampleModule`): what each keeps, its norms.

Linear and Conv1d run through a patched forward that computes the layer's output from detached
parameters, so the backward computes no weight gradient, and keeps the layer's input (a
convolution's is unfolded after the backward) and its output, whose gradient autograd retains
(``retain_grad``, a hook in C++: no Python runs during the backward). The per-example
squared norms and the clipped sum are then a few products per layer (see `per_sample`'s module
docstring for the formulas). Any other layer with trainable parameters is a
`per_sample_general._GeneralLayer`: GroupNorm and LayerNorm in closed form, the rest by torch.func
vmap.
"""

from __future__ import annotations

import functools
from typing import List, Optional, Protocol, Sequence

import torch
from torch import nn
from torch.nn import functional as F


def _cat_positions(parts: List[torch.Tensor]) -> torch.Tensor:
    """Several uses of a convolution, as more positions (the last dimension)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 2)


def _cat(parts: List[torch.Tensor]) -> torch.Tensor:
    """Several uses of one layer in a forward, as more positions (no copy for a single use)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


class _State:
    """A wrapper's bookkeeping, in a plain object: setting attributes of an nn.Module at every
    step goes through Module.__setattr__, which costs more than the arithmetic of a small layer."""

    def __init__(self):
        self.passes = 0  # forward passes so far; what a forward records is tagged with its pass
        self.seen: set = set()  # the passes whose backward has reached a vmap layer
        self.recorded = False  # a forward recorded something not yet consumed
        self.computing = False  # the vmap engine runs a layer: its hook must not record


class Owner(Protocol):
    """What a layer reads of the `per_sample.PerSampleModule` that owns it: the bookkeeping its
    layers share (that module imports this one; this one imports nothing of it)."""

    state: _State


class _Layer:
    """One trainable layer: what it recorded in the last backward, and its per-example pieces.

    ``_pairs()`` returns per example the layer's input and output gradient as ``(a, b)``, one
    pair per use of the layer in the forward whose backward reached it. The weight gradient of
    example i is ``b_i^T a_i`` summed over positions and uses.
    """

    def __init__(self, module: nn.Module, params: Sequence[str], owner: Owner, label: str):
        self.module = module
        self.label = label  # for errors: the layer's name and type
        self.params = list(params)  # trainable direct parameters, in the model's order
        self.is_weight = [n == "weight" for n in self.params]
        self.tensors = [getattr(module, n) for n in self.params]  # for their shapes
        self.state = owner.state
        self.records: list = []
        self.pairs: list = []  # (a, b) of each use the last backward reached
        self.outputs: list = []  # per parameter, its place among the model's (`PerSampleModule`)

    #: A Linear layer, whose single use on (B, p) inputs `clip_rows` takes (`_LinearLayer`)
    rows = False

    def add(self, pass_id: int, record: tuple) -> None:
        """Keep one use's (input, output gradient), noting which forward pass it belongs to."""
        self.state.seen.add(pass_id)
        self.records.append(record)

    def clear(self) -> None:
        self.records, self.pairs = [], []


class _RecordedLayer(_Layer):
    """Linear or Conv1d: the forward keeps ``(kept input, z, z's version, pass)`` per use, ``z``
    the layer's output computed from detached parameters (for the first layer, whose ``z`` is a
    leaf, before the bias), whose gradient autograd retains. An in-place change of ``z``
    (ReLU(inplace=True)) would move the retained gradient to the changed tensor: `used` checks
    the version and refuses."""

    def record(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output for ``x``; keeps what the clipped sum needs (grad mode only)."""
        params = self.module._parameters  # a dict lookup: Module.__getattr__ costs more
        weight, bias = params["weight"].detach(), params["bias"]
        bias = None if bias is None else bias.detach()
        if x.requires_grad:
            out, kept = self.compute(x, weight, bias)
            out.retain_grad()
            z = out
        else:  # the first layer: z is a leaf, which in-place operations refuse; out is not
            z, kept = self.compute(x, weight, None)
            z.requires_grad_()
            out = z.clone() if bias is None else self.add_bias(z, bias)
        state = self.state
        self.records.append((kept, z, z._version, state.passes))
        state.recorded = True
        return out

    def prune(self) -> None:
        """Forget the uses that no backward reached (a forward without backward)."""
        self.records = [r for r in self.records if r[1].grad is not None]

    def used(self) -> list:
        """The records whose backward ran, as (kept, b); checks that nothing changed z since."""
        out = []
        for kept, z, version, pass_id in self.records:
            grad = z.grad
            if grad is None:
                continue
            if z._version != version:
                raise ValueError(
                    f"per-example gradients: the output of layer {self.label} was "
                    f"changed in place (e.g. by ReLU(inplace=True)); use "
                    f"inplace=False after it, or engine='vmap'"
                )
            self.state.seen.add(pass_id)
            out.append((kept, grad))
        return out


class _LinearLayer(_RecordedLayer):
    """nn.Linear, input (B, ..., p): every middle position of an example is a position."""

    def __init__(self, module, params, owner: Owner, label: str):
        super().__init__(module, params, owner, label)
        self.has_weight = "weight" in self.params
        self.has_bias = "bias" in self.params

    rows = True

    def compute(self, x, weight, bias):
        return F.linear(x, weight, bias), x

    @staticmethod
    def add_bias(z, bias):
        return z + bias

    def _rows(self):
        """(a, b) as (B, p) and (B, q) for one position per example, else (B, T, p), (B, T, q)."""
        pairs = self.pairs
        if len(pairs) == 1 and pairs[0][0].dim() == 2:
            return pairs[0]
        return (
            _cat([x.reshape(x.shape[0], -1, x.shape[-1]) for x, _ in pairs]),
            _cat([g.reshape(g.shape[0], -1, g.shape[-1]) for _, g in pairs]),
        )

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


class _Conv1dLayer(_RecordedLayer):
    """nn.Conv1d (one group, zero padding): the unfolded input (im2col) is ``a``."""

    def __init__(self, module, params, owner: Owner, label: str):
        super().__init__(module, params, owner, label)
        #: The unfolded inputs and per-example gradients of the last step, whose memory the next
        #: step reuses: a fresh tensor of megabytes is fresh pages from the kernel at every step,
        #: and their page faults were measured to cost several times the products that fill them
        #: (cnn1d, batch 256)
        self.scratch: dict = {}

    def _scratch(self, name, shape: tuple, like: torch.Tensor, fresh: Optional[list] = None):
        """A tensor of ``shape`` in the memory kept under ``name`` (grown to the largest batch
        seen: Poisson batches vary). Its contents are the last step's where the shape is the
        same, in the same place where only the batch size (the first dimension) differs;
        otherwise ``fresh``, if given, gets True appended."""
        need = 1
        for n in shape:
            need *= n
        buf, last = self.scratch.get(name, (None, None))
        if (
            buf is None
            or buf.numel() < need
            or buf.dtype != like.dtype
            or buf.device != like.device
        ):
            buf = torch.empty(need, dtype=like.dtype, device=like.device)
            last = None
        self.scratch[name] = (buf, shape)
        if fresh is not None and (last is None or last[1:] != shape[1:]):
            fresh.append(True)
        return buf[:need].view(shape)

    def compute(self, x, weight, bias):
        """The convolution's own kernel (its backward then computes only the input's gradient:
        the parameters are detached); the input is kept with its version, and unfolded only
        after the backward (`_columns`): autograd through an unfolded input costs 3-5x the
        kernel's forward and backward at cnn1d's sizes."""
        m = self.module
        out = F.conv1d(x, weight, bias, m.stride, m.padding, m.dilation)
        return out, (x, x._version)

    @staticmethod
    def add_bias(z, bias):
        return z + bias.unsqueeze(1)

    def _unfold(self, x: torch.Tensor, name: str, ones: bool) -> torch.Tensor:
        """im2col by a strided view of the padded input: (B, C_in k, T), weight's column order,
        copied into the scratch memory ``name``; ``ones``: one more row of ones, the bias's
        input, so that one product gives the weight's and the bias's gradients together."""
        m = self.module
        (k,), (d,), (s,), (p,) = m.kernel_size, m.dilation, m.stride, m.padding
        if p:
            x = F.pad(x, (p, p))
        cols = x.unfold(2, d * (k - 1) + 1, s)  # (B, C_in, T, span)
        if d > 1:
            cols = cols[..., ::d]
        # a contiguous copy: with one input channel a reshape is a strided view, slow in products
        batch, channels, positions, span = cols.shape
        rows = channels * span
        fresh: list = []
        out = self._scratch((name, ones), (batch, rows + ones, positions), x, fresh)
        if ones and fresh:  # the row of ones stays from one step to the next
            out[:, rows].fill_(1.0)
        out[:, :rows].view(batch, channels, span, positions).copy_(cols.transpose(2, 3))
        return out

    def _columns(self, ones: bool):
        """(a, b) as (B, C_in k (+ 1 with ``ones``), T) and (B, C_out, T); several uses add
        positions. Refuses an input changed in place since the forward (the kept input would
        not be the one used)."""
        a = []
        for (x, version), _ in self.pairs:
            if x._version != version:
                raise ValueError(
                    f"per-example gradients: the input of layer {self.label} was changed in "
                    f"place after the layer used it; use inplace=False, or engine='vmap'"
                )
            a.append(self._unfold(x, f"input {len(a)}", ones))
        b = [g for _, g in self.pairs]
        return (a[0], b[0]) if len(a) == 1 else (torch.cat(a, 2), torch.cat(b, 2))

    def squared_norms(self) -> torch.Tensor:
        """Per example |(sum_t b_t a_t^T, sum_t b_t)|^2: the bias is a weight on an input of
        ones, so with ``a`` extended by a row of ones one product gives both gradients (or,
        above `MATERIALISE_LIMIT`, the Gram form, whose ``a_t.a_s + 1`` the row gives too)."""
        has_w, has_b = "weight" in self.params, "bias" in self.params
        if not has_w:  # the bias alone: its gradient is b summed over positions
            b = _cat_positions([g for _, g in self.pairs])
            totals = b.sum(2)
            self.cache = (None, None, totals)
            return torch.linalg.vecdot(totals, totals)
        a, b = self._columns(ones=has_b)
        batch, q, p = len(b), b.shape[1], a.shape[1]
        if batch * q * p > MATERIALISE_LIMIT:
            gram = torch.bmm(a.transpose(1, 2), a).mul_(torch.bmm(b.transpose(1, 2), b))
            self.cache = (a, b, None)
            return gram.flatten(1).sum(1)
        grads = torch.bmm(b, a.transpose(1, 2), out=self._scratch("gradients", (batch, q, p), a))
        grads = grads.view(batch, q * p)
        self.cache = (None, None, grads)
        return _squares(grads)

    def clipped(self, weights: torch.Tensor) -> dict:
        """sum_i w_i g_i: one product of the per-example gradients with the weights, or, when
        they were not made, one product over examples and positions together."""
        a, b, grads = self.cache
        if a is None and "weight" not in self.params:
            return {"bias": torch.mv(grads.t(), weights)}
        if grads is not None:
            total = torch.mv(grads.t(), weights).view(self.module.weight.shape[0], -1)
        else:
            total = torch.tensordot(b * weights.view(-1, 1, 1), a, dims=([0, 2], [0, 2]))
        _, channels, span = self.module.weight.shape
        out = {"weight": total[:, : channels * span]}
        if "bias" in self.params:
            out["bias"] = total[:, -1]
        return out

    def clear(self) -> None:
        self.records, self.pairs, self.cache = [], [], None

    def per_example(self) -> dict:
        b = _cat_positions([g for _, g in self.pairs])
        out = {"bias": b.sum(2)}
        if "weight" in self.params:
            a, b = self._columns(ones=False)
            grads = torch.bmm(b, a.transpose(1, 2))
            out["weight"] = grads.reshape(len(b), *self.module.weight.shape)
        return out


#: Per-example weight gradients are materialised when a layer's batch of them holds at most this
#: many numbers (64 MiB in float32); above, the Gram form keeps memory at T^2 per example.
MATERIALISE_LIMIT = 1 << 24


def _squares(rows: torch.Tensor) -> torch.Tensor:
    """Each row's squared norm. vector_norm is one fused reduction; vecdot, quicker for short
    rows, was measured 4-8x slower on per-example gradients of thousands of numbers."""
    return torch.linalg.vector_norm(rows, dim=1).square_()


def _sequence_norms(a: torch.Tensor, b: torch.Tensor, has_w: bool, has_b: bool):
    """Per example |sum_t b_t a_t^T|^2 (+ |sum_t b_t|^2 with a bias), a: (B, p, T), b: (B, q, T);
    a Linear layer applied at T positions per example (a sequence).

    The per-example gradients cost T p q to form and give the clipped sum for p q more, but
    are B p q numbers written and read twice; the Gram form sum_{t,s} (a_t.a_s + 1)(b_t.b_s)
    costs T^2 (p + q), and the clipped sum is then one product of T p q over examples and
    positions together. So the Gram form is used where it costs fewer operations,
    T (p + q) < p q, or where the gradients would not fit in `MATERIALISE_LIMIT`. Returns
    (squared norms, the per-example weight gradients flattened or None, the per-example bias
    gradients or None) for the clipped sum.
    """
    p, q, positions = a.shape[1], b.shape[1], a.shape[2]
    if not has_w:
        totals = b.sum(2)
        return torch.linalg.vecdot(totals, totals), None, totals
    if len(a) * p * q > MATERIALISE_LIMIT or positions * (p + q) < p * q:
        gram_a = torch.bmm(a.transpose(1, 2), a)
        if has_b:
            gram_a += 1
        gram_b = torch.bmm(b.transpose(1, 2), b)
        return (gram_a * gram_b).flatten(1).sum(1), None, None
    grads = torch.bmm(b, a.transpose(1, 2)).flatten(1)
    squared = _squares(grads)
    totals = None
    if has_b:
        totals = b.sum(2)
        squared += torch.linalg.vecdot(totals, totals)
    return squared, grads, totals


def _conv1d_supported(module: nn.Conv1d) -> bool:
    return (
        module.groups == 1
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    )


@functools.lru_cache(maxsize=64)
def _constants(*args) -> tuple:
    """Numbers as 0-dim tensors of ``dtype`` on ``device`` (the last two arguments), made once:
    a Python number in a tensor operation is a float64 tensor converted at every call, which
    costs more than the operation on a batch of norms (`clip_rows`)."""
    *numbers, dtype, device = args
    return tuple(torch.tensor(n, dtype=dtype, device=device) for n in numbers)


def clip_rows(
    rows: List["_LinearLayer"],
    squared: Optional[torch.Tensor],
    max_norm: float,
    scale: float,
    norm_eps: float,
    divisor: float = 1.0,
):
    """The per-example weights of the clipped sum, and the sums of the Linear layers with one
    position per example.

    ``rows``: Linear layers whose last backward recorded one use of (B, p) inputs, ``(a, b)``
    their input and output gradient; ``squared``: the other layers' per-example squared norms
    (None without other layers), used up; the recorded gradients are ``scale`` times the
    examples' own. The weights are ``c_i scale / divisor`` with the clip factors
    ``c_i = min(1, C / (|g_i| + eps))``; the sums, per layer in its parameter order, are divided
    by ``divisor``.

    At these sizes issuing an operation costs more than computing it, so this issues few (the
    tests compare it with torch.func): per layer two row norms (one fused reduction each) and
    the norm of its gradient from them, ``|b_i a_i^T| = |a_i| |b_i|`` and, with a bias, the
    bias folded in, ``|(b_i a_i^T, b_i)| = hypot(|a_i| |b_i|, |b_i|)``; the layers' norms are
    combined by hypot as well, so the total needs no square root; then
    ``c_i scale / divisor = min(k, (C k / scale) / (|b-norm_i| + eps / scale))`` with
    ``k = scale / divisor`` and ``|b-norm_i| = |g_i| / scale`` (three operations); and per
    layer ``w b`` (as (q, B)), one product for the weight and one sum for the bias.
    """
    norm_of = torch.linalg.vector_norm
    norm = None if squared is None else squared.sqrt_()
    for layer in rows:
        a, b = layer.pairs[0]
        part = norm_of(b, dim=1)  # |b_i|: the bias's norm
        if layer.has_weight:  # in place where possible: fewer tensors made and freed
            b_norm, part = part, norm_of(a, dim=1).mul_(part)  # |b_i a_i^T| = |a_i| |b_i|
            if layer.has_bias:
                part.hypot_(b_norm)  # sqrt(|a_i|^2 |b_i|^2 + |b_i|^2)
        norm = part if norm is None else norm.hypot_(part)
    k = scale / divisor
    numerator, eps = _constants(max_norm * k / scale, norm_eps / scale, norm.dtype, norm.device)
    weights = torch.div(numerator, norm.add_(eps))
    weights.clamp_max_(k)
    sums = []
    for layer in rows:
        a, b = layer.pairs[0]
        scaled = b.t() * weights  # (q, B): w_i b_i, no column view of the weights needed
        sums.append([scaled.mm(a) if weight else scaled.sum(1) for weight in layer.is_weight])
    return weights, sums
