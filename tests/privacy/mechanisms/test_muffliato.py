"""Muffliato (`privacy.mechanisms.muffliato`): the Gaussian conversion against dp-accounting, the
pairwise network figure on a ring (amplified with the distance, never above local DP), and its
epsilon under momentum, which is DP-SGD's local bound."""

from __future__ import annotations

import math

import pytest

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy import network_dp
from gossip_powersgd.privacy.mechanisms import muffliato
from mechanism_fixtures import small_config


def test_muffliato_gaussian_conversion_matches_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    for mu in (0.3, 1.0, 2.5):
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
        pld = accountant.get_epsilon(1e-5)
        exact = network_dp.gaussian_epsilon(mu, 1e-5)
        # PLD discretises pessimistically: above the exact value, by about the interval
        assert exact <= pld + 1e-9 and pld - exact < 5e-3 * max(1.0, exact)


def test_muffliato_pairwise_epsilon_on_a_ring():
    ring = topologies.ring(8)
    out = muffliato.muffliato_epsilons(ring, 12, 1.0, 0.1, 1e-5, observer=0, network=True)
    local = out[1]["local"]
    assert all(v["epsilon"] == local for v in out.values())  # the guarantee: DP-SGD's
    far, near = out[4]["network"], out[1]["network"]
    assert far < near  # amplification by mixing grows with the distance
    # never above local DP without subsampling (mu <= sqrt(T) / sigma: the view is a function of
    # the T noisy updates)
    assert near <= network_dp.gaussian_epsilon(math.sqrt(12), 1e-5) + 1e-9
    assert muffliato.hops(ring, 0).tolist() == [0, 1, 2, 3, 4, 3, 2, 1]


def test_muffliato_with_momentum_says_its_epsilon_is_the_local_bound():
    """Muffliato's network bound models plain SGD at a constant learning rate: with momentum the
    run's epsilon is DP-SGD's local one (post-processing: valid against every observer), and the
    summary and a warning line say so, naming the momentum."""
    from gossip_powersgd.training.report import format_summary
    from gossip_powersgd.training.trainer import train
    from gossip_powersgd.utils import RunWarning

    config = small_config(dp_mechanism="muffliato", momentum=0.9, lr=0.1)
    with pytest.warns(RunWarning, match=r"muffliato.*momentum 0.9.*local DP-SGD bound"):
        summary = LocalCluster(topologies.ring(4), timeout=60).run(train, config)[0]
    note = summary["dp_epsilon_note"]
    assert note.startswith("DP-SGD's local bound, valid against every observer")
    assert "momentum 0.9" in note
    assert note in format_summary(summary)
    plain = LocalCluster(topologies.ring(4), timeout=60).run(
        train, small_config(dp_mechanism="muffliato")
    )[0]
    assert "dp_epsilon_note" in plain and "momentum" not in plain["dp_epsilon_note"]
