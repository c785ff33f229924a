"""experiments/suite/tables.py: the table, its ratios and CSV, the training page's targets on them, and a
failed row reported, not lost."""

from __future__ import annotations

import csv
import io

import pytest

from experiments.pages.training.state import targets
from experiments.suite import runs, tables

from tests.experiments.suite._support import _rows


def test_table_ratio_csv_and_targets():
    rows = _rows()
    table = tables.build_table(rows)
    lines = table.strip().splitlines()
    assert lines[0] == tables.TABLE_HEADER and set(lines[1]) == {"|", "-"}
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "30.6× (96.7 % fewer)" in lines[3]
    assert "90.00 %" in lines[2] and "89.50 %" in lines[3]
    parsed = list(csv.DictReader(io.StringIO(tables.build_csv(rows))))
    assert float(parsed[1]["ratio_to_exact"]) == pytest.approx(94.3 / 3.08, rel=1e-3)
    assert float(parsed[0]["projected_s_1gbit"]) == pytest.approx(
        runs.projected_seconds(rows[0], 1e9 / 8), rel=1e-3
    )
    text = "\n".join(targets(rows, rows, []))
    assert "within 1 pp of exact gossip** (ring:8 iid, 1 seed(s), 10 epochs): MET" in text
    assert "≥ 99 % fewer bytes than exact gossip**: MISSED" in text and "Why:" in text
    assert "≥ 90 %**: MET" in text


def test_failed_row_is_reported_not_lost():
    row = {"topology": "ring:8", "partition": "iid", "label": "x", "error": "RuntimeError: boom"}
    table = tables.build_table(_rows() + [row])
    assert "FAILED: RuntimeError: boom" in table
