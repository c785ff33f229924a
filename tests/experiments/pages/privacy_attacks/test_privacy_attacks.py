"""experiments/pages/privacy_attacks: properties of the committed rows (no training): the overfit
page shows its rows beside their blind baselines; the audit figures come from their stored guesses."""

from __future__ import annotations

from pathlib import Path

from gossip_powersgd.privacy.attack_run import recheck_audit

from experiments.engine import RowFile
from experiments.pages.privacy_attacks import runs, tables


RESULTS = Path(__file__).resolve().parents[4] / "experiments" / "results"


def test_the_committed_overfit_page_shows_its_rows_beside_their_blind_baseline_and_audit_split():
    name = "privacy_attacks_overfit"
    records = RowFile(RESULTS / f"{name}.jsonl").read()
    text = (RESULTS / f"{name}.md").read_text()
    row = records[runs.key("powergossip:rank=1", None, 0)].row
    group = [records[runs.key("powergossip:rank=1", None, s)].row for s in (0, 1, 2)]
    flats = [tables._last(r)["flat"] for r in group]
    line = (
        f"| PowerGossip r1 | none | victim | {tables._stat([f['auc/victim/LOSS'] for f in flats])} | "
        f"{tables._stat([f['auc/victim/LiRA offline'] for f in flats])} | "
    )
    assert line in text
    prior = tables._stat([f["auc/class prior"] for f in flats])
    assert f"| {prior} |" in text  # the blind baseline beside the figure
    # the audit record: the run's split, stored once per seed, members and held-out disjoint
    split = records["split/seed0"].row
    assert row["split"] == split["key"]
    for v in split["record"]["victims"]:
        held = set(split["record"]["heldout"][str(v)])
        assert held and not held & set(split["record"]["members"][str(v)])


def test_the_committed_rows_audit_figures_come_from_their_stored_guesses():
    records = RowFile(RESULTS / "privacy_attacks.jsonl").read()
    audited = [r.row for r in records.values() if "audit" in r.row]
    assert audited, "the committed page carries no audited run"
    text = (RESULTS / "privacy_attacks.md").read_text()
    for row in audited:
        for source in ("observer", "victim"):
            assert recheck_audit(row["audit"], source) == row["audit"][source]["epsilon"]
        assert f"{row['audit']['victim']['epsilon']:.2f}" in text
        if row["target"] is None:
            assert row["eps_max"] == float("inf")
