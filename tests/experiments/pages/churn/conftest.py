"""The churn page's --quick sweep as its tests read it (the rows file and the plan's rows)."""

from __future__ import annotations

import pytest

from experiments.engine import RowFile, Rows, checked_plan
from experiments.pages import pages


@pytest.fixture(scope="package")  # once for the package's test files, as once per file before
def quick(quick_sweep):
    sweep = quick_sweep("churn")
    assert sweep.code == 0
    out = sweep.out
    records = RowFile(out / "churn.jsonl").read()
    runs = checked_plan(pages()["churn"], True, {k: r.row for k, r in records.items()})
    rows = Rows("churn", True, [records[r.key] for r in runs], len(runs))
    return out, rows
