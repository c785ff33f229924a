"""The pairwise network-DP report (`privacy.network_report.pairwise_report`): its matrix is
`pairwise_epsilon`'s, its summary is over the pairs u != v, no pair exceeds the local-DP ceiling
(the observer's view is a function of what u's own noisy values reveal plus others' independent
noise), and with noise once Muffliato's per-message sum is reported beside it."""

from __future__ import annotations

import numpy as np

from gossip_powersgd.privacy.network_dp import local_epsilon, pairwise_epsilon
from gossip_powersgd.privacy.network_report import pairwise_report


def test_the_report_summarises_the_exact_matrix_under_its_ceiling():
    report = pairwise_report("ring:6", 4, 5.0, 1e-5, "once")
    eps = pairwise_epsilon("ring:6", 4, 5.0, 1e-5, noise="once")
    assert np.array_equal(np.array(report["matrix"]), eps, equal_nan=True)  # nan: u = v
    off = eps[~np.eye(6, dtype=bool)]
    assert (report["min"], report["max"]) == (off.min(), off.max())
    assert report["median"] == np.median(off)
    assert report["local"] == local_epsilon(4, 5.0, 1e-5, noise="once")
    assert report["max"] <= report["local"] * (1 + 1e-9)  # the ceiling, up to the solver's rounding
    assert 0 <= report["at_local"] <= 1
    assert report["per_message_min"] <= report["per_message_max"]
    for share in ("per_message_below_exact", "per_message_above_local"):
        assert 0 <= report[share] <= 1


def test_fresh_noise_every_step_has_no_per_message_sum_and_a_larger_ceiling():
    """Every step's fresh noise reveals more of u's own values (T releases, not one), so the
    ceiling grows with the steps; the per-message sum is reported only for noise once."""
    once = pairwise_report("ring:4", 3, 5.0, 1e-5, "once")
    every = pairwise_report("ring:4", 3, 5.0, 1e-5, "every_step")
    assert "per_message_min" not in every and every["noise"] == "every_step"
    assert every["local"] > once["local"]
    assert every["max"] <= every["local"] * (1 + 1e-9)
