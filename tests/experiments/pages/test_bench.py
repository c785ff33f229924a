"""experiments/pages/_bench.py: what the benchmark pages share (parameters compared bit for bit, the
zoo's shapes)."""

from __future__ import annotations

import pytest
import torch

from experiments.pages._bench import compare_params, model_shapes
from gossip_powersgd.training.models import build_model


def test_compare_params_is_bitwise():
    a = [torch.tensor([0.0, 1.0]), torch.ones(2, 2)]
    assert compare_params(a, [t.clone() for t in a]) == {"identical": True, "max_difference": 0.0}
    b = [torch.tensor([-0.0, 1.0]), torch.ones(2, 2)]  # equal as numbers, not as bits
    assert compare_params(a, b) == {"identical": False, "max_difference": 0.0}
    c = [torch.tensor([0.0, 1.0]), torch.full((2, 2), 1.5)]
    assert compare_params(a, c) == {"identical": False, "max_difference": 0.5}


@pytest.mark.parametrize(
    "model, spec", [("resnet20", "resnet20"), ("vgg16", "vgg16:bn=false"), ("vgg16_bn", "vgg16")]
)
def test_shapes_are_the_zoo_models_the_trainer_builds(model, spec):
    built = build_model(spec, (3, 32, 32), 10)
    assert model_shapes(model) == [(n, tuple(p.shape)) for n, p in built.named_parameters()]
