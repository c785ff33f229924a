"""experiments/pages/bandwidth/rows.py: where the emulated cluster cannot be made, --quick still makes
every row and the page says what it did not measure."""

from __future__ import annotations


def test_quick_without_the_clusters_privileges_says_what_it_did_not_measure(tmp_path, monkeypatch):
    """Where namespaces cannot be made (no root), --quick makes every row all the same: the step
    times and the complete runs say why they are missing, and the page says they were not run."""
    from experiments.engine import RowFile, sweep
    from experiments.pages import pages
    from experiments.pages.bandwidth import rows

    monkeypatch.setattr(rows, "cluster_problem", lambda: "no CAP_NET_ADMIN (uid 1000)")
    sweep(pages()["bandwidth"], tmp_path, quick=True)
    stored = RowFile(tmp_path / "bandwidth.jsonl").read()
    skipped = [k for k, r in stored.items() if "skipped" in r.row]
    assert skipped == ["timing/ring:2/10mbit", "e2e/ring:2/pg-r1/10mbit", "fault/torch/kill"]
    page = (tmp_path / "bandwidth.md").read_text()
    assert "Not run: no CAP_NET_ADMIN (uid 1000)" in page
    assert "## The answer\n\nNot measured" in page
    assert not (tmp_path / "bandwidth.png").exists()
