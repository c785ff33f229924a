"""experiments/pages/bench_scale/__init__.py: the slope fit recovers known exponents; the --quick
page has every section and marks the points that took turns."""

from __future__ import annotations

import os

import pytest

from experiments.engine import RowFile
from experiments.pages.bench_scale import KINDS, slope, summarize


def test_slope_recovers_exponents():
    assert slope([(1, 3.0), (10, 300.0), (100, 30000.0)]) == pytest.approx(2.0)
    assert slope([(8, 5.0), (256, 5.0)]) == pytest.approx(0.0)
    assert slope([(8, 5.0)]) is None


def test_quick_page_has_every_section_and_marks_points_that_took_turns(quick_sweep):
    sweep = quick_sweep("bench_scale")
    tmp_path = sweep.out
    assert sweep.code == 0
    page = (tmp_path / "bench_scale.md").read_text()
    records = [r.row for r in RowFile(tmp_path / "bench_scale.jsonl").read().values()]
    assert not [r for r in records if "error" in r]
    for heading in (
        "## Cost vs number of peers",
        "## Ring all-reduce vs the all-gather reduction",
        "## Cost vs model size",
        "## Growth rates",
    ):
        assert heading in page
    # each in-process point records whether its threads took turns, and the page marks those
    turns = [r["point"]["peers"] > os.cpu_count() for r in records]
    assert [r["ranks"][0]["takes_turns"] for r in records] == turns
    assert ("‡ the peer threads took turns" in page) == any(turns)
    assert set(summarize(records[0])) == set(KINDS)
