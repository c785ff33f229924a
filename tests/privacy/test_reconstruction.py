"""`privacy.reconstruction`: what a curious neighbour reads off the messages it received — exact
gossip bit for bit, full-rank PowerGossip exactly, compressed messages closer than the trivial
estimate (the observer's own model)."""

from __future__ import annotations

import pytest
import torch

from gossip_powersgd.privacy.reconstruction import (
    reconstruct,
    reconstruction_errors,
    relative_error,
    trivial_estimates,
)
from privacy_attack_scenarios import run_views


def test_reconstruction_reads_exact_gossip_off_bit_for_bit(tmp_path):
    results, views = run_views("exact", steps=3, tmp=tmp_path)
    estimates = reconstruct(views[0], 1)
    for step in range(3):
        assert all(torch.equal(e, t) for e, t in zip(estimates[step], results[1]["sent"][step]))


def test_reconstruction_is_exact_for_full_rank_powergossip(tmp_path):
    results, views = run_views("powergossip:rank=6,min_compression_rate=0", steps=4, tmp=tmp_path)
    truth = {step: sent for step, sent in enumerate(results[3]["sent"])}
    errors = reconstruction_errors(views[0], 3, truth, window=1)
    assert errors["steps"] == [0, 1, 2, 3]
    assert max(errors["estimate"]) < 1e-10  # right and left half-steps alike (square factors)
    assert min(errors["trivial"]) > 1e-3


def test_low_rank_powergossip_reconstruction_beats_the_trivial_estimate(tmp_path):
    results, views = run_views("powergossip:rank=1", steps=6, tmp=tmp_path)
    truth = dict(enumerate(results[1]["sent"]))
    errors = reconstruction_errors(views[0], 1, truth, window=4)
    assert all(e < t for e, t in zip(errors["estimate"], errors["trivial"]))
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        reconstruct(views[0], 1, window=0)
    with pytest.raises(ValueError, match="not a neighbour"):
        reconstruct(views[0], 2)


@pytest.mark.parametrize(
    "spec", ["choco:compressor=identity,gamma=0.5", "deepsqueeze:compressor=identity,gamma=0.5"]
)
def test_public_estimates_are_the_model_with_the_identity_compressor(spec, tmp_path):
    results, views = run_views(spec, steps=4, tmp=tmp_path)
    estimates = reconstruct(views[2], 1)
    for step in range(4):
        assert relative_error(estimates[step], results[1]["sent"][step]) < 1e-12


def test_compressed_public_estimates_are_closer_than_the_trivial_one(tmp_path):
    results, views = run_views("choco:compressor=topk:0.3,gamma=0.3", steps=6, tmp=tmp_path)
    errors = reconstruction_errors(views[0], 1, dict(enumerate(results[1]["sent"])))
    assert errors["estimate"][-1] < errors["trivial"][-1]


def test_choco_reconstruction_needs_every_step(tmp_path):
    _, views = run_views(
        "choco:compressor=topk:0.3,gamma=0.3", steps=3, observe_every=2, tmp=tmp_path
    )
    with pytest.raises(ValueError, match="observe_every=1"):
        reconstruct(views[0], 1)


def test_trivial_estimate_is_the_observers_own_model(tmp_path):
    results, views = run_views("exact", steps=2, tmp=tmp_path)
    own = trivial_estimates(views[0])
    assert all(torch.equal(a, b) for a, b in zip(own[1], results[0]["sent"][1]))
    assert relative_error(own[1], own[1]) == 0.0
