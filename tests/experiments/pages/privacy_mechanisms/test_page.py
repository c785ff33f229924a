"""experiments/pages/privacy_mechanisms/page.py: the page's rule for a clear effect (a difference
beyond twice the larger seed spread, either way; one seed decides nothing)."""

from __future__ import annotations

from experiments.pages.privacy_mechanisms.page import _clear


def test_an_effect_is_clear_only_beyond_twice_the_spread_either_way():
    assert _clear(1.01, 0.5, 3) == "helps" and _clear(-1.01, 0.5, 3) == "hurts"
    assert _clear(1.0, 0.5, 3) == _clear(-1.0, 0.5, 3) == "no clear effect"  # at 2 × spread: not
    assert _clear(0.0, 0.0, 3) == "no clear effect" and _clear(1e-9, 0.0, 3) == "helps"
    assert _clear(50.0, 0.1, 1) == "one seed"
    assert _clear(3.0, 1.0, 2, ("lead", "no lead", "no lead")) == "lead"
