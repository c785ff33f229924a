"""An algorithm spec is parsed once into a typed `AlgorithmSpec` (`parse_algorithm`): config
validation parses it, and set-up, every peer's algorithm, the privacy mechanisms and the membership
code read that object (`TrainConfig.algorithm_spec`) instead of parsing the text again."""

from __future__ import annotations

import pytest

from gossip_powersgd import run
from gossip_powersgd.algorithms import (
    REGISTRY,
    AlgorithmSpec,
    PowerGossip,
    algorithm_kwargs,
    make_algorithm,
    parse_algorithm,
)
from gossip_powersgd.algorithms import registry
from gossip_powersgd.training.config import config_from_dict


def test_the_spec_is_typed_once_and_its_rank_is_an_int():
    spec = parse_algorithm("powergossip:rank=2,iters=3")
    assert (
        isinstance(spec, AlgorithmSpec) and spec.cls is PowerGossip and spec.name == "powergossip"
    )
    assert spec.kwargs["rank"] == 2 and type(spec.kwargs["rank"]) is int
    assert dict(spec.options) == {"rank": "2", "iters": "3"} and str(spec) == spec.text
    assert spec.label() == "PowerGossip r2 K3"
    assert parse_algorithm(spec) is spec and parse_algorithm("powergossip:rank=2,iters=3") is spec
    assert algorithm_kwargs(spec) == (PowerGossip, {"rank": 2, "num_iterations": 3})
    with pytest.raises(TypeError):
        spec.kwargs["rank"] = 3  # read-only: the object travels, nobody edits it
    with pytest.raises(
        ValueError, match=r"algorithm spec 'powergossip:rank=two'.*bad value 'two' for rank"
    ):
        parse_algorithm("powergossip:rank=two")
    config = config_from_dict({"algorithm": "powergossip:rank=2,iters=3"})
    assert config.algorithm_spec is spec


def test_a_whole_run_parses_its_spec_text_once(monkeypatch):
    text = "powergossip:rank=2,seed=913"  # a text no other test parses: not cached yet
    parsed = []
    split = registry.split_spec

    def counting(spec):
        if spec == text:
            parsed.append(spec)
        return split(spec)

    monkeypatch.setattr(registry, "split_spec", counting)
    result = run(
        dict(
            topology="ring:4",
            algorithm=text,
            dataset="synthetic_logreg:d=20,classes=4,n=2000",
            model="logreg",
            lr=0.5,
            epochs=1,
            seed=0,
            quiet=True,
            dp_noise_multiplier=0.5,
            dp_max_grad_norm=1.0,
            dp_mechanism="zipdl",
            dp_zipdl_sigma=0.01,
        )
    )
    # validation, the set-up's config checks, the mechanism's capability check and four peers'
    # algorithms all read the one AlgorithmSpec
    assert parsed == [text] and result.config.algorithm_spec.kwargs["rank"] == 2


def test_a_name_registered_to_another_class_is_parsed_again(monkeypatch):
    first = parse_algorithm("exact:gamma=0.5")

    class Other(first.cls):
        pass

    monkeypatch.setitem(REGISTRY, "exact", Other)
    again = parse_algorithm("exact:gamma=0.5")
    assert again.cls is Other and again is not first and again != first
    monkeypatch.undo()
    assert parse_algorithm("exact:gamma=0.5").cls is first.cls


def test_make_algorithm_takes_the_text_or_the_parsed_spec():
    import topologies
    import torch

    from gossip_powersgd.comm.local import LocalCluster

    def build(comm, spec):
        params = [torch.ones(4, 3)]
        return type(make_algorithm(spec, params, comm)).__name__, make_algorithm(
            parse_algorithm(spec), [torch.ones(4, 3)], comm
        ).rank

    values = LocalCluster(topologies.ring(3), timeout=60).run(build, "powergossip:rank=2")
    assert values == [("PowerGossip", 2)] * 3
