"""Each mechanism's noise for a target epsilon against a neighbour
(`privacy.mechanisms.calibration`): DP-SGD's sigma ends at the target by its accountant (within the
solver's 1 %), the same against every peer; Muffliato and ZIP-DL report DP-SGD's local bound at its
sigma (their network figures are no guarantee for training), ZIP-DL's zero-sum std is its ratio
times one step's DP noise on the model; DECOR's SecLDP epsilon against the neighbour is the target,
its sigma_cor the ratio times sigma_ind, and a peer holding every pair key sees sigma_ind alone."""

from __future__ import annotations

import math

import pytest

from gossip_powersgd.privacy.mechanisms.calibration import calibrate, subsampled_epsilon

SETTING = dict(batch_size=32, shard=200, epochs=4, lr=0.5, schedule="constant")


@pytest.fixture(scope="module")
def noises():
    return calibrate("ring:6", **SETTING, target=4.0, delta=1e-5, clip=1.0, decor_ratio=4.0)


def test_dp_sgd_ends_at_the_target_against_every_peer(noises):
    local = noises["local"]
    q, steps = 32 / 200, 4 * math.ceil(200 / 32)
    assert (local["q"], local["steps"], local["far_peer"]) == (q, steps, 3)
    assert local["neighbour"] == local["far"] == local["local"]
    assert local["neighbour"] == subsampled_epsilon(local["sigma"], q, steps, 1e-5)
    assert 0.99 * 4.0 <= local["neighbour"] <= 4.0  # noise_for_target's tolerance
    assert local["neighbour_pld"] <= local["neighbour"] * 1.05  # PLD is the tighter accountant


def test_muffliato_and_zipdl_report_dp_sgds_local_bound(noises):
    local = noises["local"]
    for name in ("muffliato", "zipdl"):
        row = noises[name]
        assert row["sigma"] == local["sigma"] and row["neighbour"] == local["neighbour"]
        assert "no guarantee for training" in row["note"] and "lr is constant" in row["note"]
    assert noises["zipdl"]["zipdl_sigma"] == pytest.approx(0.5 * local["sigma"] / 32, rel=1e-12)
    ratio = calibrate("ring:6", **SETTING, target=4.0, delta=1e-5, clip=1.0, zipdl_ratio=2.0)
    assert ratio["zipdl"]["zipdl_sigma"] == pytest.approx(2 * noises["zipdl"]["zipdl_sigma"])


def test_decor_meets_the_target_against_the_neighbour_with_its_correlated_noise(noises):
    decor = noises["decor"]
    assert decor["sigma_cor"] == 4.0 * decor["sigma"]
    # the bisection keeps the sigma at or above the target's, 0.1 % apart: epsilon a hair below
    assert 0.98 * 4.0 <= decor["neighbour"] <= 4.0
    # a peer holding all the victim's pair keys removes the correlated noise: sigma_ind alone
    q, steps = decor["q"], decor["steps"]
    assert decor["local"] == subsampled_epsilon(decor["sigma"], q, steps, 1e-5)
    assert decor["local"] > decor["neighbour"]
