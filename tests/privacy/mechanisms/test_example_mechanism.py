"""A new privacy mechanism is one file plus one registry line: this file is the file,
`register_mechanism(Tally)` (in the fixture, so that the registry other tests see stays as shipped)
the line. The mechanism says what it needs of the algorithm (a capability the algorithm class
declares), never which algorithms: validation asks the algorithm registry, and a run attaches it."""

from __future__ import annotations

import pytest
import torch

from gossip_powersgd import run
from gossip_powersgd.privacy.mechanisms import (
    MECHANISM_REGISTRY,
    Mechanism,
    register_mechanism,
    validate_mechanism_config,
)
from gossip_powersgd.cli.help import describe_registries
from gossip_powersgd.training.config import TrainConfig

CONFIG = dict(
    topology="ring:4",
    algorithm="exact",
    dataset="synthetic_logreg:d=20,classes=4,n=2000",
    partition="iid",
    model="logreg",
    lr=0.5,
    epochs=1,
    eval_every=1,
    seed=0,
    quiet=True,
    dp_noise_multiplier=0.5,
    dp_max_grad_norm=1.0,
    dp_public_randomness=True,  # every run draws the same DP noise: runs compare bit for bit
)


class Tally:
    """A per-edge hook that adds nothing and counts the rows it saw."""

    def __init__(self):
        self.rows = 0

    def __call__(self, step, neighbors, weights, rows):
        assert rows.shape[0] == len(neighbors) == len(weights)
        self.rows += rows.shape[0]


class Counting(Mechanism):
    name = "counting"
    summary = "a per-edge hook that counts the messages and adds no noise (the example)"
    needs = "supports_edge_noise"
    static_graph = True
    attached = []

    def attach(self, config, comm, dp, algorithm, randomness, resume):
        algorithm.edge_noise = Tally()
        type(self).attached.append((comm.rank, algorithm.edge_noise))
        return algorithm.edge_noise


@pytest.fixture
def registered():
    register_mechanism(Counting)
    Counting.attached = []
    yield
    MECHANISM_REGISTRY.unregister("counting")


def test_validation_asks_the_algorithm_what_it_supports(registered):
    validate_mechanism_config(TrainConfig(**dict(CONFIG, dp_mechanism="counting")))
    validate_mechanism_config(
        TrainConfig(**dict(CONFIG, dp_mechanism="counting", algorithm="powergossip:rank=2"))
    )
    # the list of algorithms comes from their classes' supports_edge_noise
    with pytest.raises(
        ValueError, match=r"counting works with algorithm exact or powergossip, not choco"
    ):
        validate_mechanism_config(
            TrainConfig(
                **dict(CONFIG, dp_mechanism="counting", algorithm="choco:compressor=sign,gamma=0.1")
            )
        )
    with pytest.raises(ValueError, match=r"dp_mechanism: counting runs on DP-SGD"):
        validate_mechanism_config(
            TrainConfig(**dict(CONFIG, dp_mechanism="counting", dp_noise_multiplier=None))
        )
    assert "  counting  a per-edge hook" in describe_registries()
    MECHANISM_REGISTRY.unregister("counting")
    with pytest.raises(
        ValueError, match=r"must be one of local, muffliato, zipdl, decor, got 'counting'"
    ):
        validate_mechanism_config(TrainConfig(**dict(CONFIG, dp_mechanism="counting")))


def test_a_run_attaches_it_on_every_peer_and_it_sees_every_message(registered):
    plain = run(CONFIG, states=True)
    counted = run(dict(CONFIG, dp_mechanism="counting"), states=True)
    assert sorted(rank for rank, _ in Counting.attached) == [0, 1, 2, 3]
    # exact gossip on a ring: each step every peer sends one message to each of its 2 neighbours
    steps = counted.steps
    assert all(tally.rows == 2 * steps for _, tally in Counting.attached) and steps > 0
    # the hook added nothing, so the models are those of dp_mechanism: local, bit for bit
    for rank, state in plain.states.items():
        assert all(torch.equal(state[k], counted.states[rank][k]) for k in state)


def test_an_unknown_capability_is_refused_at_registration():
    class Wants(Mechanism):
        name = "wants"
        summary = "needs what no algorithm declares"
        needs = "supports_teleportation"

    with pytest.raises(TypeError, match=r"`needs` \(None or one of supports_edge_noise"):
        register_mechanism(Wants)
