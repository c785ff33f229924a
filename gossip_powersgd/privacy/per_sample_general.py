"""Per-example gradients of any layer the recorded ones (`per_sample_layers`: Linear, Conv1d) do not
cover: a forward hook keeps its inputs and output gradient, and after the backward the layer is
differentiated one example at a time under ``torch.func.vmap``; GroupNorm and LayerNorm in closed
form."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from gossip_powersgd.privacy.per_sample_layers import Owner, _Layer, _squares


class _GeneralLayer(_Layer):
    """Any other layer with its own trainable parameters: per-example gradients by vmap(vjp).

    A forward hook keeps the layer's inputs and, at backward, the gradient at its output; the
    layer is then differentiated alone, one example at a time under ``torch.func.vmap``. Needs a
    layer that takes tensors (batch first) and returns one tensor, like every torch.nn layer
    that treats examples independently.
    """

    def __init__(self, module, params, owner: Owner, label: str):
        super().__init__(module, params, owner, label)
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        if self.state.computing or not torch.is_grad_enabled():
            return
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"per-example gradients: layer {self.label} returns "
                f"{type(out).__name__}, not one tensor; use engine='hooks' (Opacus)"
            )
        if out.requires_grad:
            pass_id = self.state.passes
            out.register_hook(lambda g: self.add(pass_id, (args, g)))

    def per_example(self) -> dict:
        """This layer's per-example gradients, one (B, *shape) tensor per parameter."""
        self.state.computing = True  # its own forward hook must not record the vmap's calls
        try:
            return self._per_example()
        finally:
            self.state.computing = False

    def squared_norms(self) -> torch.Tensor:
        self.grads = self.per_example()
        return sum(_squares(g.flatten(1)) for g in self.grads.values())

    def clipped(self, weights: torch.Tensor) -> dict:
        return {
            n: torch.einsum("i,i...->...", weights.to(g.dtype), g) for n, g in self.grads.items()
        }

    def used(self) -> list:
        """The (inputs, output gradient) of each use the backward reached (its hooks ran)."""
        return self.records

    def prune(self) -> None:
        """Nothing to forget: only a backward records (`_hook`)."""

    def clear(self) -> None:
        self.records, self.pairs, self.grads = [], [], {}

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
                    lambda q: torch.func.functional_call(self.module, q, inputs), p
                )
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
            grads = {
                "weight": (normed * g).sum(dims) if dims else normed * g,
                "bias": g.sum(dims) if dims else g,
            }
            for n in self.params:
                total[n] = grads[n] if n not in total else total[n] + grads[n]
        return total
