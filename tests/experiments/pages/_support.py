"""Helpers of the page test files in tests/experiments/pages/: a page's committed rows."""

from __future__ import annotations

from pathlib import Path

from experiments.engine import RowFile


RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"


def _committed(name):
    return [r.row for r in RowFile(RESULTS / f"{name}.jsonl").read().values()]
