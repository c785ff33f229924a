"""experiments/pages/privacy_mechanisms_budget.py: the verdict on doubling the budget, and the
committed page is the verdict of its rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.engine import RowFile
from experiments.pages import privacy_mechanisms_budget as budget


RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"


def _budget_rows(epochs, accs, mechanism="local", topology="ring:8"):
    return [
        dict(
            topology=topology,
            mechanism=mechanism,
            algorithm="exact gossip",
            seed=s,
            epochs=epochs,
            acc_avg=a,
        )
        for s, a in enumerate(accs)
    ]


@pytest.mark.parametrize(
    "short, long, expected",
    [
        ([0.870, 0.875, 0.880], [0.872, 0.877, 0.878], 128),  # +0.07 pp: no doubling pays
        ([0.870, 0.875, 0.880], [0.900, 0.905, 0.910], None),  # +3 pp, sd 0.5: it pays
        ([0.870], [0.900], None),  # one seed: no spread, no plateau shown
    ],
)
def test_the_mechanisms_budget_verdict(short, long, expected):
    rows = _budget_rows(128, short) + _budget_rows(128, [0.9], "none")
    rows += _budget_rows(256, long) + _budget_rows(256, [0.95], "none")
    table = budget.cells(rows)
    assert budget.verdicts(table) == {"ring:8": expected}
    (step,) = budget.doublings(table[("ring:8", "local", "exact gossip")])
    assert step["gain"] == pytest.approx(100 * (sum(long) / len(long) - sum(short) / len(short)))


def test_the_committed_budget_page_is_the_verdict_of_its_rows():
    rows = [r.row for r in RowFile(RESULTS / "privacy_mechanisms_budget.jsonl").read().values()]
    runs = [r for r in rows if "acc_avg" in r]  # the calibrations have none
    assert {r["epochs"] for r in runs} == {128, 256, 512, 1024}
    verdicts = budget.verdicts(budget.cells(runs))
    assert verdicts == {"ring:8": 256, "ring:16": 256, "exponential:16": 512}
    page = (RESULTS / "privacy_mechanisms_budget.md").read_text()
    assert "- **exponential:16**: **512 epochs**: no private row gains clearly" in page
