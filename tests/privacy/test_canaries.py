"""The audit's public canaries (`privacy.canaries.public_canaries`, `canary_hooks`): a function of
the run's seed, at the training inputs' scale, with labels of the data's classes; their inclusion
secret to each victim (fresh keystream coins, not those the public seed would give). Inserting
and scoring canaries in a run: tests/privacy/test_audit.py."""

from __future__ import annotations

import pytest
import torch

from gossip_powersgd.privacy.audit import audit_counts, draw_inclusion
from gossip_powersgd.privacy.canaries import canary_hooks, public_canaries
from gossip_powersgd.privacy.seeds import Randomness
from gossip_powersgd.training.data import load_dataset

DATA = "synthetic_logreg:d=20,classes=4,n=400"


def test_canaries_are_public_but_their_inclusion_is_secret_to_each_victim():
    data = load_dataset(DATA, 0)
    first, again = (canary_hooks([1, 3], data, 256, seed=5) for _ in range(2))
    for a, b in zip(first, again):
        # the canaries are a function of the seed (the neighbour may know them) ...
        assert a.x.equal(b.x) and a.y.equal(b.y) and a.x.shape == (256, 20)
        # ... their inclusion is not: fresh secret coins per run (2^-256 to agree by chance),
        # and not the coins a keystream derived from the public seed would give
        assert not a.included.equal(b.included)
        for seed in (0, 5):
            public = draw_inclusion(Randomness.public(seed, a.victim), 256)
            assert not a.included.equal(public)
    assert {h.name for h in first} == {"canaries of peer 1", "canaries of peer 3"}


def test_public_canaries_are_at_the_datas_scale_and_differ_per_victim_and_seed():
    """4000 x 20 Gaussian draws with the training inputs' mean and sd: the sample mean is within
    5 standard errors (sd / sqrt(80000)) of it, the sd within 2 %; every label is a class of the
    data, each class drawn (4000 uniform draws over 4)."""
    data = load_dataset(DATA, 0)
    x, y = public_canaries(data, 4000, victim=1, seed=0)
    mean, sd = float(data.x_train.float().mean()), float(data.x_train.float().std())
    assert abs(float(x.mean()) - mean) < 5 * sd / (x.numel() ** 0.5)
    assert abs(float(x.std()) / sd - 1) < 0.02
    assert x.dtype == data.x_train.dtype and y.dtype == data.y_train.dtype
    assert set(y.tolist()) == set(range(data.num_classes))
    for other in (public_canaries(data, 4000, victim=2, seed=0), public_canaries(data, 4000, 1, 1)):
        assert not torch.equal(other[0], x)


def test_too_few_canaries_for_an_audit_are_refused_before_training_naming_the_fix():
    """Before: one canary got the counts (1, 1) from `audit_counts`, and `canary_audit` failed only
    after the training with "k_pos + k_neg = 2 guesses for 1 canaries", naming no fix."""
    data = load_dataset(DATA, 0)
    message = (
        r"^the one-run audit needs at least 2 canaries in all \(one guessed in, one out\), "
        r"got {}: give more canaries$"
    )
    for m in (0, 1):
        with pytest.raises(ValueError, match=message.format(m)):
            audit_counts(m)
    with pytest.raises(ValueError, match=message.format(1)):
        canary_hooks([3], data, 1, seed=0)
    assert audit_counts(2) == [(1, 1)]  # two canaries: one guess each
    assert len(canary_hooks([1, 3], data, 1, seed=0)) == 2  # one per victim, two in all
