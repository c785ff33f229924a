"""The knowledge-matrix attack on recorded runs, scored against the truth
(`privacy.knowledge_attack`): graph distances by hand; on exact gossip averaging every peer's
private value is recovered from one colluder's messages to float64 rounding while the blind
guesses are off; on PowerGossip the exactly gossiped vector is recovered and the compressed matrix
is never counted determined; the fewest colluders for everyone (`knowledge.colluders_for_all`)."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy import load_view
from gossip_powersgd.privacy.knowledge import colluders_for_all, colluders_needed
from gossip_powersgd.privacy.knowledge_attack import colluder_attack, distances

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


def test_distances_on_a_ring_and_a_torus():
    assert distances("ring:6") == [0, 1, 2, 3, 2, 1]
    assert distances("torus:3x3") == [0, 1, 1, 1, 2, 2, 1, 2, 2]
    assert distances("ring:6", source=2) == [2, 1, 0, 1, 2, 3]


def test_one_peer_determines_everyone_on_a_ring_once_the_steps_carry_the_values_to_it():
    """ring:6 averaging: after one step peer 0 holds only its neighbours' values (no colluder
    set of up to two peers determines everyone, and none off the target's neighbourhood its
    value); after three, peer 0 alone determines everyone."""
    assert colluders_for_all("ring:6", 1, updates="once", most=1) == (None, ())
    assert colluders_needed("ring:6", 1, 3, updates="once", most=1) == (None, ())
    assert colluders_for_all("ring:6", 3, updates="once") == (1, (0,))
    assert colluders_needed("ring:6", 3, 3, updates="once") == (1, (0,))


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
