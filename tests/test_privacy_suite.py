"""`python -m experiments.suite privacy` (experiments/suite/privacy.py): its regime is
privacy_dp_sweep.md's (imported, not copied), and its page's plateau columns are computed from each
run's evaluations."""

from __future__ import annotations

import csv

import pytest


def test_the_privacy_page_trains_in_the_regime_the_dp_sweep_chose():
    from experiments.privacy_attacks import dp_sweep, measure
    from experiments.suite import privacy

    plan = privacy.privacy_plan(quick=False)
    _, np_batch, _, _, np_epochs, _ = dp_sweep.NONPRIVATE
    _, dp_batch, dp_lr, clip, _, _ = dp_sweep.CHOSEN
    assert (plan["batch"], plan["lr"], plan["epochs"]) == (
        np_batch,
        measure.NONPRIVATE_LR,
        np_epochs,
    )
    # the sweep's recipe, trained for the budget privacy_dp_budget.md found at each epsilon
    assert (plan["dp_batch"], plan["dp_lr"], plan["dp_epochs"]) == (dp_batch, dp_lr, None)
    assert privacy.CLIP == clip and privacy.REGIME is dp_sweep.BASE
    assert set(plan["epsilons"]) == {1.0, 3.0, 8.0, None}
    # --epochs overrides both kinds of rows (a shorter page for a smoke run)
    short = privacy.privacy_plan(quick=False, epochs=2)
    assert short["epochs"] == short["dp_epochs"] == 2


def test_the_privacy_page_reports_each_rows_last_quarter(tmp_path):
    from experiments.suite.driver import main

    main(["privacy", "--quick", "--epochs", "4", "--out", str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / "privacy.csv").open()))
    page = (tmp_path / "privacy.md").read_text()
    assert rows and all(r["error"] == "" for r in rows)
    for r in rows:
        acc, three = float(r["acc_avg"]), float(r["acc_3q"])
        # the page's change column is the final accuracy minus the one at 3/4 of the run
        assert f"| {100 * three:.2f} % | {100 * (acc - three):+.2f} |" in page
    assert "change over the last quarter (pp)" in page


def test_two_jobs_give_the_non_private_rows_of_one_job_bit_for_bit(tmp_path):
    """Runs in worker processes train exactly as in-process: the non-private rows (no secret
    noise) are equal to the last bit; every row has every seed."""
    from experiments.suite.driver import main

    rows = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        main(["privacy", "--quick", "--epochs", "2", "--jobs", str(jobs), "--out", str(out)])
        rows[jobs] = list(csv.DictReader((out / "privacy.csv").open()))
    assert [(r["label"], r["target"]) for r in rows[1]] == [
        (r["label"], r["target"]) for r in rows[2]
    ]
    plain = [(a, b) for a, b in zip(rows[1], rows[2]) if a["target"] == ""]
    assert plain and all(a["acc_avg"] == b["acc_avg"] for a, b in plain)
    assert all(r["seeds"] == "1" for r in rows[1])  # --quick: seed 0 only


def test_bad_jobs_is_a_one_line_error(tmp_path):
    from experiments.suite.privacy import run_privacy

    with pytest.raises(SystemExit, match="give 1 or more runs at once"):
        run_privacy(tmp_path, quick=True, jobs=0)
