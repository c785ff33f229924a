"""experiments/pages/privacy_attacks/network.py: the network-DP section's table from the cases'
numbers (each case one row: noise, steps, topology, the pairwise ε's min / median / max, the share
at the local ceiling, the ceiling, and Muffliato's per-message sum where computed, else n/a)."""

from __future__ import annotations

from experiments.pages.privacy_attacks.network import network_text


def _case(noise, steps, topology, **extra):
    case = dict(noise=noise, steps=steps, topology=topology, min=0.0123, median=1.5, max=8.04)
    return dict(case, at_local=0.25, local=9.87654, **extra)


def test_each_case_is_one_row_of_the_table():
    summed = dict(per_message_min=0.5, per_message_max=12.0, per_message_below_exact=0.1)
    cases = [_case("once", 16, "ring:8", **summed, per_message_above_local=0.75)]
    cases.append(_case("every_step", 32, "torus:4x4"))
    text = network_text(dict(sigma=1.5, delta=1e-5, cases=cases))
    assert (
        "| once | 16 | ring:8 | 0.0123 | 1.5 | 8.04 | 25 % | 9.88 | 0.5 – 12; 10 %; 75 % |" in text
    )
    assert "| every step | 32 | torus:4x4 | 0.0123 | 1.5 | 8.04 | 25 % | 9.88 | n/a |" in text
    assert "privacy_attacks_network_dp.png" in text
