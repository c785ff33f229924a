"""experiments/engine/plan.py: a page's plan is checked before anything runs: a key planned twice
is refused."""

from __future__ import annotations

import pytest

from experiments.engine import Page, Run, sweep

from engine_pages import PAGE


def test_a_plan_with_a_run_twice_is_refused(tmp_path):
    twice = Page(
        "twice", "", lambda quick, rows: [Run("k", {}), Run("k", {})], PAGE.row, PAGE.render
    )
    with pytest.raises(ValueError, match="page twice: the plan has run 'k' twice"):
        sweep(twice, tmp_path)
