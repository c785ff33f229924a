"""experiments/pages/bench_gossip/report.py: the efficiency the kernel speeds alone allow, against
its closed form (a right half-step costs 1/a_right + 2/a_update copy-times of the matrix, a left
one 1/a_left + 2/a_update, against 3 for a copy). The tables and the page from measured rows: the
page's committed rows drawn again byte for byte (tests/experiments/pages/test_every_page.py)."""

from __future__ import annotations

import pytest

from experiments.pages.bench_gossip.report import _prediction


def _speeds(k, right, left, update, before=(1.0, 1.0, 1.0)):
    speed = {
        f"k{k}.{key}.library": v
        for key, v in zip(("right", "left", "update"), (right, left, update))
    }
    speed.update({f"k{k}.{key}.before": v for key, v in zip(("right", "left", "update"), before)})
    return speed


def test_kernels_at_copy_speed_allow_full_efficiency_and_slower_ones_their_closed_form():
    full = _prediction(_speeds(4, 1.0, 1.0, 1.0), 4)
    assert full == pytest.approx({k: 1.0 for k in full})  # exact: 3 / (1 + 2)
    p = _prediction(_speeds(1, 1.0, 0.5, 0.5, before=(0.5, 0.5, 0.5)), 1)
    right, left = 1 / 1.0 + 2 / 0.5, 1 / 0.5 + 2 / 0.5  # 5 and 6 copy-times
    assert p["lib_right"] == pytest.approx(3 / right) and p["lib_left"] == pytest.approx(3 / left)
    assert p["lib_mean"] == pytest.approx(6 / (right + left))
    assert p["old_right"] == p["old_left"] == p["old_mean"] == pytest.approx(0.5)  # uniform: s
