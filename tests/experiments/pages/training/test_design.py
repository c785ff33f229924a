"""experiments/pages/training/design.py: the plan defers the swept rows until their sweep is in; a
partial page says which stages did not run."""

from __future__ import annotations

from experiments.pages.training import design, state

from tests.experiments.pages.training._support import EXACT


def test_plan_defers_the_swept_rows_until_their_sweep_is_in():
    before = design.plan(False, {})
    assert len({r.key for r in before}) == len(before)
    assert not any(
        r.config["label"] in design.SLOW_ROWS and r.config["kind"] != "sweep" for r in before
    )
    sweeps = {
        r.key: {"label": r.config["label"], "gamma": r.config["gamma"], "acc_avg": acc}
        for r, acc in zip([r for r in before if r.config["kind"] == "sweep"], [0.5, 0.7, 0.6] * 2)
    }
    after = design.plan(False, sweeps)
    # 6 sweep runs; iid: 6 rows on seed 0, 4 on seeds 1 and 2 (Choco: one seed); Dirichlet: 6
    # main rows and 4 more of the grid; 4 wide-model rows; 2 reference rows: the page's 36
    assert len(after) == 36 and [r.key for r in after][:6] == list(sweeps)
    choco = [
        r for r in after if r.config["label"] == design.CHOCO_SIGN and r.config["kind"] == "iid"
    ]
    assert [r.key for r in choco] == ["iid/choco:compressor=sign,gamma=1.0/seed0"]
    assert choco[0].config["gamma"] == 1.0 and choco[0].cost > after[6].cost
    quick = design.plan(True, {})
    assert [r.key for r in quick] == [
        "iid/exact/seed0",
        "iid/powergossip:rank=1,iters=1/seed0",
        "noniid/exact/seed0",
        "noniid/powergossip:rank=1,iters=1/seed0",
    ]


def test_partial_page_says_which_stages_did_not_run():
    partial = {
        "stage_seconds": {"γ sweep": 12.0},
        "timing": "",
        "how": "each in one process",
        "sweeps": [EXACT],
        "iid": [],
        "noniid": [],
        "noniid_extra": [],
        "wide": [],
        "reference": [],
    }
    text = state.running_time(partial, list(design.STAGES[1:]))
    assert text.startswith("**Partial page: 1 of 6 stages finished**") and "γ sweep 12 s" in text
    assert "1 training runs" in text
    assert "Partial" not in state.running_time(dict(partial), [])
