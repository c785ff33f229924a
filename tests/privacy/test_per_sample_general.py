"""privacy/per_sample_general.py: the per-example gradients of layers without a ghost rule — the
closed form of GroupNorm and LayerNorm and the vmap of any other layer — equal torch.func's, one
example's own loss at a time; a layer that returns no single tensor is refused in one line.
(Every engine x layer type against the clipped-sum reference: tests/privacy/test_per_sample.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gossip_powersgd.privacy.per_sample import PerSampleModule

BATCH = 5


def per_example_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Each example's own gradient of its own loss, by torch.func (independent of the engines)."""
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss(p, xi, yi):
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return [grads[n] for n, _ in model.named_parameters()]


def norms_model():
    """GroupNorm over (B, C, L) and LayerNorm over the last two dimensions: the closed forms'
    sums over positions; PReLU (no ghost rule, no closed form) goes through vmap."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(2, 4, 3, bias=False),
        nn.GroupNorm(2, 4),
        nn.LayerNorm((4, 6)),
        nn.Flatten(),
        nn.Linear(24, 6),
        nn.PReLU(6, init=0.3),
        nn.Linear(6, 3),
    ).double()


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_norm_layers_in_closed_form_and_other_layers_by_vmap_equal_torch_func(engine):
    model = norms_model()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 2, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (BATCH,), generator=g)
    expected = per_example_reference(model, x, y)
    wrapped = PerSampleModule(model, engine)
    F.cross_entropy(wrapped(x), y).backward()
    for mine, theirs in zip(wrapped.per_example_gradients(BATCH), expected):
        # float64 throughout: the two differ by the rounding of a few sums of O(10) terms
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.weight, x


class FirstOf(nn.Module):
    def __init__(self):
        super().__init__()
        self.pair = TwoOutputs()

    def forward(self, x):
        return self.pair(x)[0]


def test_a_layer_that_returns_no_single_tensor_is_refused_naming_the_other_engine():
    wrapped = PerSampleModule(FirstOf(), "vmap")
    with pytest.raises(ValueError) as info:
        wrapped(torch.randn(BATCH, 3, requires_grad=True))
    message = str(info.value)
    assert "'pair' (TwoOutputs) returns tuple, not one tensor" in message
    assert "engine='hooks'" in message and "\n" not in message
