"""Tests for topologies.stepcache: the step checks every time-varying topology shares (and a
static topology's, as the constant schedule)."""

from __future__ import annotations

import pytest

import topologies


# --- steps ---------------------------------------------------------------------------------------


def test_bad_steps_are_refused():
    s = topologies.matchings(4)
    for t, match in (
        (-1, "must be >= 0"),
        (1.5, "must be an integer"),
        (True, "must be an integer"),
    ):
        with pytest.raises(ValueError, match=match):
            s.at(t)
    with pytest.raises(ValueError, match="must be >= 0"):
        topologies.ring(4).at(-1)
    with pytest.raises(ValueError, match="no period"):
        topologies.product_gap(s)
