"""experiments/pages/_markdown.py: the helpers every page's text shares."""

from __future__ import annotations


def test_a_chosen_value_at_its_grids_end_is_said_and_a_one_point_grid_has_no_end():
    from experiments.pages._markdown import grid_end

    assert [grid_end(v, (0.1, 0.2, 0.4)) for v in (0.1, 0.2, 0.4)] == ["smallest", "", "largest"]
    assert grid_end(0.4, (0.4,)) == ""  # exact gossip with H = 4: one point, nothing beyond it
