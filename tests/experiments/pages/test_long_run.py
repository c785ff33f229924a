"""experiments/pages/long_run: many PowerGossip steps keep the average and the memory (a short run of
its row), and the page says NO where a limit is passed."""

from experiments.engine import Record, Rows, Run
from experiments.pages import long_run


def _page(config, records):
    run = Run("r", config)
    row = {"records": records}
    record = Record(
        "r", **run.identity(), quick=True, row=row, commit="c", finished="d", seconds=1.0
    )
    return long_run.render(Rows("long_run", True, [record], 1))["long_run.md"]


def test_a_short_long_run_keeps_the_average_and_the_memory():
    config = dict(topology="ring:8", rank=1, steps=200, log_every=100)
    records = long_run.row(Run("r", config))["records"]
    assert [r["step"] for r in records] == [1, 100, 200]
    checks = long_run.summarize(records)
    assert checks["drift_ok"] and checks["memory_ok"]
    page = _page(config, records)
    assert "| max relative drift of the average |" in page and "| yes |" in page
    assert "| resident memory, step 100 -> 200 |" in page


def test_the_page_says_no_where_a_limit_is_passed():
    records = [
        {"step": s, "consensus_distance": 1.0, "average_drift": d, "rss_bytes": m, "seconds": 1.0}
        for s, d, m in ((1, 1e-8, 100e6), (100, 2e-6, 100e6), (200, 1e-8, 106e6))
    ]
    checks = long_run.summarize(records)
    assert not checks["drift_ok"] and not checks["memory_ok"]  # 2e-6 > 1e-6; +6 % > +5 %
    page = _page(dict(topology="ring:8", rank=1, steps=200, log_every=100), records)
    assert page.count("| NO |") == 2
