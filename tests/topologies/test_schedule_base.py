"""Tests for topologies.schedule_base: what every undirected schedule shares (here: the union of
one period's graphs must be connected)."""

from __future__ import annotations

import numpy as np
import pytest

import topologies


# --- connected union -----------------------------------------------------------------------------


def test_disconnected_union_of_a_period_is_rejected(tmp_path):
    pair = tmp_path / "pair.txt"
    pair.write_text("0 1\n2 3\n")
    with pytest.raises(ValueError, match=r"over one period \(2 steps\) has 2 components"):
        topologies.parse(f"cyclic:file:{pair},file:{pair}")


# --- the helpers every schedule uses ---------------------------------------------------------------


def test_metropolis_on_gives_the_closed_form_and_ignores_repeats_and_self_loops():
    """Path 0-1-2 and an isolated peer 3: W_ij = 1 / (1 + max(d_i, d_j)) on an edge, the rest of
    each row on the diagonal, an isolated peer keeps 1. Repeated edges, either orientation, and a
    self-loop change nothing. Exact fractions of small integers: equal to the float's rounding."""
    from topologies.schedule_base import metropolis_on

    third = 1 / 3
    expected = np.array(
        [
            [1 - third, third, 0, 0],
            [third, 1 - 2 * third, third, 0],
            [0, third, 1 - third, 0],
            [0, 0, 0, 1],
        ]
    )
    plain = metropolis_on(4, np.array([[0, 1], [1, 2]]))
    np.testing.assert_allclose(plain, expected, rtol=0, atol=1e-15)
    noisy = metropolis_on(4, np.array([[1, 0], [0, 1], [2, 1], [3, 3], [1, 2]]))
    np.testing.assert_array_equal(noisy, plain)


def test_a_random_schedule_is_checked_over_its_first_64_steps_per_peer():
    """A schedule without a period is connected if its first `random_window(n)` = 64 n steps are:
    a join one step after the window is refused naming that window, one inside it accepted."""
    from topologies.schedule_base import WINDOW_PER_PEER, Schedule, random_window

    class JoinsLate(Schedule):
        def __init__(self, n: int, join_at: int):
            self._setup(n, f"joins_late:{n}", None, ("joins_late", n, join_at))
            self._join_at = join_at
            self._check_union_connected()

        def _step_edges(self, t: int) -> np.ndarray:  # 0-1 and 2-3; 1-2 from `join_at` on
            return np.array([[0, 1], [2, 3]] + ([[1, 2]] if t >= self._join_at else []))

    assert random_window(4) == 4 * WINDOW_PER_PEER == 256
    JoinsLate(4, random_window(4) - 1)  # the last step of the window joins them: accepted
    with pytest.raises(ValueError, match=r"over the first 256 steps \(64 per peer\) has 2 comp"):
        JoinsLate(4, random_window(4))
