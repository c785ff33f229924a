"""experiments/pages/privacy_mechanisms/__init__.py: the plan calibrates each topology before its
runs and reuses DP-SGD's rows where Muffliato's noise is DP-SGD's; every committed run is attacked,
with a balanced AUC (no training)."""

from __future__ import annotations

import math
import re

from experiments.engine import RowFile
from experiments.pages import privacy_mechanisms as mechanisms

from tests.experiments.pages.privacy_mechanisms._support import RESULTS


def test_the_plan_calibrates_each_topology_before_its_runs_and_reuses_dpsgds_for_muffliato():
    first = mechanisms.plan(False, {})
    assert [r.key for r in first] == [f"calibration/{t}" for t in mechanisms.TOPOLOGIES]
    local = {"sigma": 6.8, "steps": 8192}
    rows = {r.key: {"local": local, "muffliato": local, "zipdl": {}, "decor": {}} for r in first}
    runs = mechanisms.plan(False, rows)[1:]
    ring8 = [r for r in runs if r.key.startswith("ring:8/")]
    # non-private, local, zipdl, decor per algorithm (Muffliato's noise is DP-SGD's: its runs)
    assert len(ring8) == 2 * 4 * 3 and not any("muffliato" in r.key for r in ring8)
    assert all(r.config["noise"] is local for r in ring8 if r.config["mechanism"] == "local")
    rows["calibration/ring:8"] = dict(rows["calibration/ring:8"], muffliato={"sigma": 5.0})
    assert sum("ring:8/muffliato" in r.key for r in mechanisms.plan(False, rows)) == 2 * 3


def test_every_committed_run_is_attacked_with_a_balanced_auc_and_exact_gossip_sends_the_model():
    records = RowFile(RESULTS / "privacy_mechanisms_logreg.jsonl").read().values()
    rows = [r.row for r in records if r.config["kind"] == "run"]
    assert len(rows) == 3 * 2 * 4 * 3  # topologies, algorithms, mechanisms but Muffliato, seeds
    for row in rows:
        for key in ("auc/received/LOSS", "auc/victim's own/LOSS", "auc/blind model/LOSS"):
            assert 0.0 <= row[key] <= 1.0
        assert row["members"] == row["nonmembers"] > 0  # a balanced AUC
        assert not math.isnan(row["acc_half"]) and not math.isnan(row["acc_3q"])
        if row["algorithm"] == "exact gossip" and row["mechanism"] in ("none", "local", "decor"):
            # exact gossip sends the model itself (no noise on the wire for these): the observer's
            # received model is the victim's, so the two attacks score identically
            assert row["auc/received/LOSS"] == row["auc/victim's own/LOSS"]
        if row["algorithm"] == "exact gossip" and row["mechanism"] == "zipdl":
            # ZIP-DL's zero-sum noise is on the message only: what is received is not the model
            assert row["auc/received/LOSS"] != row["auc/victim's own/LOSS"]
    page = (RESULTS / "privacy_mechanisms_logreg.md").read_text()
    # every placeholder of the page's text was filled (an f-string prefix once went missing)
    assert not re.search(r"\{[A-Za-z_][A-Za-z_0-9.\[\]'\"]*(\(|\})", page)
    # under a decaying lr the last quarter's rise is no plateau test: the page draws no verdict
    plateau = page.split("## Trained to a plateau?")[1].split("\n## ")[0]
    assert "however long the run" in plateau and "privacy_mechanisms_budget.md" in plateau
    assert "plateau at this measure" not in plateau and "**not** shown" not in plateau
