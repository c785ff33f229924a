"""The knowledge-matrix attack on recorded runs, scored against the truth
(`privacy.knowledge_attack`): on exact gossip averaging every peer's private value is recovered
from one colluder's messages to float64 rounding while the blind guesses are off; on PowerGossip
the exactly gossiped vector is recovered and the compressed matrix is never counted determined."""

from __future__ import annotations

import numpy as np
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


def test_on_a_schedule_each_received_row_takes_the_estimate_of_a_colluder_that_heard_it():
    """one_peer_exponential:8 pairs i with i XOR 2^t at step t: colluders 0 and 3 both have peers
    1 and 2 in their union graphs, but 0 hears 1 at step 0 only and 3 hears it at step 1 only
    (2: the other way round). Each received row took the estimate of the first colluder with
    the sender among its neighbours, 0's, which holds no step 0 of peer 2: KeyError. Now each row
    takes a colluder's that heard it: on the exactly gossiped vector that estimate is the
    message's value itself (the same float64 numbers the exact route reads), the peers the
    colluders pin down (1 and 2, heard alone at step 0; 4..7 reach them only as one average) are
    recovered (a 12 x 8 system of float64 messages: 1e-9) and the matrix is never determined."""
    from gossip_powersgd.privacy.knowledge import attackable_indices, system_from_views
    from gossip_powersgd.privacy.knowledge_attack import _rhs
    from gossip_powersgd.privacy.reconstruction import reconstruct

    spec, schedule = "powergossip:rank=1,min_compression_rate=0,gamma=1.0", "one_peer_exponential:8"
    views = views_of(spec, schedule, 3)
    out = colluder_attack(views, [0, 3], schedule, initial(), "averaging", ONCE)
    determined = {int(p) for p, c in out["peers"].items() if c["exact/once"]["determined"]}
    assert determined == {1, 2}
    assert all(out["peers"][str(p)]["exact/once"]["error"] < 1e-9 for p in determined)
    assert not any(c["compressed/once"]["determined"] for c in out["peers"].values())
    mine = {c: views[c] for c in (0, 3)}
    system = system_from_views(mine, schedule, updates="once")
    assert {(0, 2), (1, 1)} <= set(system.rows)  # 3 heard 2 at step 0, 1 at step 1
    estimates = {c: {j: reconstruct(v, j) for j in v.meta["neighbors"]} for c, v in mine.items()}
    exact = attackable_indices(views[0])
    heard = _rhs(system, mine, initial(), exact, estimates)
    assert np.array_equal(heard, _rhs(system, mine, initial(), exact, None))


@pytest.mark.parametrize("spec", ["exact:gamma=0.3", "powergossip:rank=1,gamma=0.3"])
def test_the_attack_solves_with_the_runs_consensus_step(spec):
    """A run gossiping with gamma 0.3 (ring:4's own is 1): the colluder's system is built with the
    step the config gives, so every value it calls determined is recovered (float64 messages, a
    4 x 4 system: 1e-9); with the topology's step instead, the same rows claimed determined
    were off by 0.16 to 1.1."""
    views = views_of(spec, "ring:4", 3)
    out = colluder_attack(views, [0], "ring:4", initial(), "averaging", ONCE, gamma=0.3)
    for cell in out["peers"].values():
        assert cell["exact/once"]["determined"]
        assert cell["exact/once"]["error"] < 1e-9


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


def _run_config(**extra):
    config = dict(dataset="synthetic_logreg:d=8,classes=3,n=400", model="logreg", epochs=4)
    config.update(topology="ring:6", algorithm="exact", batch_size=40, lr=0.5, seed=0)
    config.update(backend="local", quiet=True, log_every=0, momentum=0.0, warmup_epochs=0.0)
    return dict(config, **extra)


def test_attack_run_averaging_gives_one_curious_peer_every_privately_trained_model():
    """ring:6, two batches a local epoch (`epoch_steps` 2: one gossip step every epoch, the
    first after the private training, then frozen models), 4 epochs: 4 gossip steps, enough for
    the opposite peer's value to reach a neighbour of peer 0, so peer 0 alone determines every
    other peer's trained model and recovers it to float32 level (float32 messages solved in
    float64 through a 6 x 6 system: 1e-5 relative), where the blind x0 is off by exactly 1."""
    from gossip_powersgd.privacy.knowledge_attack import attack_run

    out = attack_run(_run_config(), "averaging", [[0]], epoch_steps=2)
    assert out["modes"] == ["once"] and out["steps"] == 4
    (attack,) = out["attacks"]
    assert sorted(attack["peers"]) == ["1", "2", "3", "4", "5"]
    for cell in attack["peers"].values():
        assert cell["exact/once"]["determined"]
        assert cell["exact/once"]["error"] < 1e-5
        assert cell["exact/blind_initial"] == pytest.approx(1.0)
    assert 0.0 <= out["accuracy"] <= 1.0


def test_attack_run_attacks_with_the_configs_consensus_step():
    """As above through `attack_run`: algorithm exact with gamma 0.4 on ring:6 (the topology's
    own is 1.2), the step read from the config: every peer recovered to float32 level (as in the
    test above)."""
    from gossip_powersgd.privacy.knowledge_attack import attack_run

    out = attack_run(_run_config(algorithm="exact:gamma=0.4"), "averaging", [[0]], epoch_steps=2)
    for cell in out["attacks"][0]["peers"].values():
        assert cell["exact/once"]["determined"]
        assert cell["exact/once"]["error"] < 1e-5


def test_attack_run_refuses_an_averaging_epoch_that_is_not_one():
    from gossip_powersgd.privacy.knowledge_attack import attack_run

    with pytest.raises(ValueError, match="epoch_steps 3 is not an epoch"):
        attack_run(_run_config(), "averaging", [[0]], epoch_steps=3)
    with pytest.raises(ValueError, match="needs epoch_steps"):
        attack_run(_run_config(), "averaging", [[0]])


def test_an_averaging_config_with_a_warm_up_past_its_epoch_is_refused_naming_the_regime():
    """The averaging regime freezes the learning rate at epoch 1 (milestone 1.0); a warm-up longer
    than that used to move the freeze to its end (the models still training while they gossip),
    then was refused as a milestone the user never wrote: now named as the regime's own limit."""
    from gossip_powersgd.privacy.knowledge_attack import averaging_config

    assert averaging_config(dict(warmup_epochs=1.0), 13)["milestones"] == [1.0]
    with pytest.raises(ValueError, match="averaging regime freezes .* warmup_epochs 2 ends after"):
        averaging_config(dict(warmup_epochs=2), 13)


def test_attack_modes_per_regime():
    from gossip_powersgd.privacy.knowledge_attack import attack_modes

    assert attack_modes("averaging", 8) == {"once": ("once", 1)}
    assert attack_modes("dsgd", 8) == {"every_step": ("every_step", 1), "tie=8": ("every_step", 8)}
    with pytest.raises(ValueError, match="regime must be one of"):
        attack_modes("gossip")


def test_summarize_groups_peers_by_distance_and_takes_medians():
    """Three non-neighbours with errors 0.1, 0.3, 0.2 (one determined) and a neighbour: the
    non-neighbours' median 0.2 and max 0.3; a part with no parameters gives no summary."""
    from gossip_powersgd.privacy.knowledge_attack import summarize

    def cell(distance, error, determined, blind=0.5):
        out = {"distance": distance, "exact/once": {"error": error, "determined": determined}}
        return dict(out, **{"exact/blind_mean": blind, "exact/blind_initial": 1.0})

    peers = {"1": cell(1, 0.0, True), "2": cell(2, 0.1, True), "3": cell(3, 0.3, False)}
    peers["4"] = cell(2, 0.2, False, blind=0.7)
    attack = {"colluders": [0], "parts": {"exact": 7, "compressed": 0}, "peers": peers}
    near, far = summarize([attack], ["once"])
    assert (near["peers"], near["count"], near["determined"]) == ("neighbours", 1, 1)
    assert (far["peers"], far["count"], far["determined"]) == ("non-neighbours", 3, 1)
    assert far["error_median"] == pytest.approx(0.2) and far["error_max"] == pytest.approx(0.3)
    assert far["blind_mean_median"] == pytest.approx(0.5) and far["blind_initial_median"] == 1.0
    assert (far["part"], far["mode"], far["parameters"], far["colluders"]) == (
        "exact",
        "once",
        7,
        [0],
    )
