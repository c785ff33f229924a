"""The knowledge-matrix attack on recorded runs, scored against the truth
(`privacy.knowledge_attack`): on exact gossip averaging every peer's private value is recovered
from one colluder's messages to float64 rounding while the blind guesses are off; on PowerGossip
the exactly gossiped vector is recovered and the compressed matrix is never counted determined."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy import load_view
from gossip_powersgd.privacy.knowledge_attack import colluder_attack

SHAPES = [(6, 6), (5,)]  # a matrix PowerGossip compresses, a vector it gossips exactly
ONCE = {"once": ("once", 1)}


def _gossip(comm, spec, steps):
    """Every peer gossips its private float64 values (added once, before the first step) and
    records its view."""
    from gossip_powersgd.algorithms import make_algorithm
    from gossip_powersgd.privacy.views import ViewRecorder

    g = torch.Generator().manual_seed(100 + comm.rank)
    x = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
    algorithm = make_algorithm(spec, x, comm)
    recorder = ViewRecorder(algorithm)
    for t, s in zip(x, SHAPES):
        t.add_(torch.randn(s, generator=g, dtype=torch.float64))
    for _ in range(steps):
        algorithm.step()
        recorder.flush()
    return recorder


def views_of(spec, topology, steps):
    results = LocalCluster(topologies.parse(topology), timeout=60).run(_gossip, spec, steps)
    return {k: load_view(recorder) for k, recorder in enumerate(results)}


def initial():
    return [torch.zeros(s) for s in SHAPES]


def test_exact_gossip_averaging_gives_every_peers_value_to_one_colluder():
    """ring:4, two steps of exact gossip (gamma 1) from peer 0's view: every other peer's value
    is determined and recovered (float64 messages, a 4 x 4 well-conditioned system: 1e-12), the
    public initial model is off by 1 exactly and the colluder's own value by far more."""
    views = views_of("exact:gamma=1.0", "ring:4", 2)
    out = colluder_attack(views, [0], "ring:4", initial(), "averaging", ONCE)
    assert out["colluders"] == [0] and out["parts"] == {"exact": 41, "compressed": 0}
    assert sorted(out["peers"]) == ["1", "2", "3"]
    for peer, cell in out["peers"].items():
        assert cell["distance"] == (2 if peer == "2" else 1)
        assert cell["exact/once"]["determined"]
        assert cell["exact/once"]["error"] < 1e-12
        assert cell["exact/blind_initial"] == pytest.approx(1.0)
        assert cell["exact/blind_mean"] > 0.5


def test_powergossip_gives_away_its_exact_vector_and_never_its_compressed_matrix():
    """PowerGossip r1 on ring:4: the vector, gossiped exactly, is recovered as under exact gossip;
    the matrix (36 of the 41 parameters) is estimated by plugging in reconstructions, and never
    counted determined."""
    spec = "powergossip:rank=1,min_compression_rate=0,gamma=1.0"
    views = views_of(spec, "ring:4", 3)
    out = colluder_attack(views, [0], "ring:4", initial(), "averaging", ONCE)
    assert out["parts"] == {"exact": 5, "compressed": 36}
    for cell in out["peers"].values():
        assert cell["exact/once"]["error"] < 1e-9
        assert not cell["compressed/once"]["determined"]


def test_an_unknown_regime_is_refused():
    with pytest.raises(ValueError, match="regime must be one of averaging, dsgd"):
        colluder_attack({}, [0], "ring:4", initial(), "gossip", ONCE)


def test_a_run_with_every_peer_observed_gives_the_attack_its_views_and_x0():
    """A real run (ring:4, exact gossip, decentralized SGD): every rank's view and the public
    initial model built from the seed; from peer 0's view its neighbours' last models are read
    off exactly (received as sent, float32 compared in float64), the opposite peer's is not
    determined."""
    from gossip_powersgd.privacy.knowledge_attack import observe_every_peer
    from gossip_powersgd.training.data import load_dataset
    from gossip_powersgd.training.models import build_model

    config = dict(dataset="synthetic_logreg:d=8,classes=3,n=400", model="logreg", epochs=1)
    config.update(topology="ring:4", algorithm="exact", batch_size=40, lr=0.5, seed=3)
    config.update(backend="local", quiet=True, log_every=0, momentum=0.0, warmup_epochs=0.0)
    result, views, x0 = observe_every_peer(config)
    assert sorted(views) == [0, 1, 2, 3] and result.summary["steps"] == max(views[0].steps) + 1
    data = load_dataset(config["dataset"], 3)
    expected = build_model("logreg", data.input_shape, data.num_classes, 3).parameters()
    assert all(torch.equal(a, b) for a, b in zip(x0, expected))
    modes = {"every_step": ("every_step", 1)}
    out = colluder_attack(views, [0], "ring:4", x0, "dsgd", modes)
    for peer, cell in out["peers"].items():
        if cell["distance"] == 1:
            assert cell["exact/every_step"]["error"] < 1e-12
        else:
            assert not cell["exact/every_step"]["determined"]
