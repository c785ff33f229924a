"""experiments/pages/privacy_knowledge/__init__.py: real properties of the knowledge-matrix attack
as the page measures it, on the page's --quick plan (ring:4 / ring:6, seconds): on a ring,
averaging gives a non-neighbour away to one curious peer once the steps have carried it there, and
decentralized SGD without tied updates does not; exact gossip's reconstruction of a determined
peer is at float32 level; PowerGossip's compressed matrices are not reconstructed better than the
blind guess; a run whose epoch is not its local steps is refused."""

from __future__ import annotations

import pytest

from experiments.engine import Run
from experiments.pages.privacy_knowledge import plan, row


def _structure(spec, updates, tie, steps, most=2):
    config = dict(kind="structure", topology=spec, updates=updates, tie=tie, steps=steps)
    return row(Run(f"structure/{spec}", dict(config, most=most)))


def test_averaging_on_a_ring_reaches_the_opposite_peer_once_the_steps_carry_it_there():
    """ring:6, peer 0 alone: after one step it holds only its neighbours' values; after three
    (the opposite peer's value has reached a neighbour) every peer is determined, so one curious
    peer is enough, for the opposite peer and for everyone."""
    one = _structure("ring:6", "once", 1, 1)
    assert one["updates_by_distance"] == {"1": [2, 2], "2": [0, 2], "3": [0, 1]}
    assert one["colluders_for_target"] is None
    three = _structure("ring:6", "once", 1, 3)
    assert three["updates_by_distance"] == {"1": [2, 2], "2": [2, 2], "3": [1, 1]}
    assert (three["colluders_for_target"], three["colluder_set_for_target"]) == (1, [0])
    assert (three["colluders_for_all"], three["colluder_set_for_all"]) == (1, [0])


def test_decentralized_sgd_hides_non_neighbours_unless_updates_are_tied():
    """A fresh update per step: no non-neighbour's update or model is determined, by peer 0 or
    by any pair of its non-neighbours; tied over the whole run (the paper's assumption), the same
    steps determine every peer."""
    fresh = _structure("ring:6", "every_step", 1, 4)
    for d in ("2", "3"):
        assert fresh["updates_by_distance"][d][0] == 0
        assert fresh["models_by_distance"][d][0] == 0
    assert fresh["models_by_distance"]["1"] == [2, 2]  # received as they are
    assert fresh["colluders_for_target"] is None
    tied = _structure("ring:6", "every_step", 4, 4)
    assert all(c[0] == c[1] for c in tied["updates_by_distance"].values())


def _peers(rows, key, colluders=(0,)):
    attack = next(a for a in rows[key]["attacks"] if a["colluders"] == list(colluders))
    return attack["peers"]


def test_exact_gossip_averaging_gives_every_non_neighbours_trained_model_away(attack_rows):
    """Every peer's contribution is determined by peer 0's knowledge after the quick run's steps;
    the solve recovers it to float32 level (float32 messages, a well-conditioned 6 x 6 system:
    1e-5 relative), where the blind guess is off by tens of percent."""
    peers = _peers(attack_rows, "attack/averaging/exact")
    far = {p: c for p, c in peers.items() if c["distance"] >= 2}
    assert far
    for cell in far.values():
        assert cell["exact/once"]["determined"]
        assert cell["exact/once"]["error"] < 1e-5
        assert cell["exact/blind_mean"] > 0.1
        assert cell["exact/blind_initial"] == pytest.approx(1.0)


def test_powergossip_compressed_matrices_are_not_reconstructed_better_than_blind(attack_rows):
    """PowerGossip r1: its exactly-sent vector is given away as under exact gossip, its compressed
    matrix is not determined for any non-neighbour and the plug-in estimate is no better than
    the colluders' own mean."""
    for regime, mode in (("averaging", "once"), ("dsgd", "every_step")):
        peers = _peers(attack_rows, f"attack/{regime}/pg-r1")
        far = [c for c in peers.values() if c["distance"] >= 2]
        assert far
        for cell in far:
            assert not cell[f"compressed/{mode}"]["determined"]
            assert cell[f"compressed/{mode}"]["error"] >= cell["compressed/blind_mean"]
    for cell in _peers(attack_rows, "attack/averaging/pg-r1").values():
        assert cell["exact/once"]["error"] < 1e-5


def test_dsgd_neighbours_models_are_read_off_and_non_neighbours_are_not_determined(attack_rows):
    peers = _peers(attack_rows, "attack/dsgd/exact")
    for cell in peers.values():
        if cell["distance"] == 1:
            # received as sent, in float32, compared in float64: exact
            assert cell["exact/every_step"]["error"] < 1e-12
        else:
            assert not cell["exact/every_step"]["determined"]
            assert cell["exact/every_step"]["error"] > 1e-3


def test_an_averaging_run_whose_epoch_is_not_its_local_steps_is_refused():
    run = next(r for r in plan(True, {}) if r.key == "attack/averaging/exact")
    bad = Run(key=run.key, config=dict(run.config, epoch_steps=3), seed=run.seed)
    with pytest.raises(ValueError, match="epoch_steps 3 is not an epoch"):
        row(bad)
