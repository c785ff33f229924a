"""experiments/pages/training: the equal-bytes comparison (first reach of a target, accuracy within
a byte budget), the non-IID gap table, seed-averaged histories, the wide-model target, the plan
and the page drawn from rows, all on synthetic rows with known answers (no training)."""

import csv
import io

import pytest

from experiments.engine import Record, Rows
from experiments.pages.training import convergence, design, state
from experiments.suite.runs import combine


def _evals(points, local=0.01):
    """(epoch, MB, averaged accuracy) -> eval dicts; local models `local` below the average."""
    return [
        {
            "epoch": e,
            "mb": mb,
            "acc_avg": a,
            "acc_local_mean": a - local,
            "acc_local_min": a - 2 * local,
        }
        for e, mb, a in points
    ]


def _row(label, points, spec=None, mb_per_step=None, **extra):
    evals = _evals(points)
    last = evals[-1]
    row = {
        "label": label,
        "spec": spec or label,
        "algorithm": spec or label,
        "topology": "ring:8",
        "partition": "iid",
        "model": "cnn1d",
        "epochs": last["epoch"],
        "parameters": 100,
        "acc_avg": last["acc_avg"],
        "acc_local_mean": last["acc_local_mean"],
        "acc_local_min": last["acc_local_min"],
        "mb_per_peer": last["mb"],
        "mb_per_step": mb_per_step if mb_per_step is not None else last["mb"] / 10,
        "evals": evals,
        "curve": [(e["mb"], e["acc_avg"]) for e in evals],
        "compute_s": 1.0,
        "rounds": 10,
        "critical_bytes": 1000,
        "run_seconds": 2.0,
    }
    row.update(extra)
    return row


EXACT = _row("exact gossip", [(2, 10.0, 0.50), (4, 20.0, 0.80), (6, 30.0, 0.90)], spec="exact")
CHEAP = _row(
    "PowerGossip r1 (1 iter)",
    [(2, 0.5, 0.45), (4, 1.0, 0.78), (6, 1.5, 0.88)],
    spec="powergossip:rank=1,iters=1",
)


def test_first_reach_is_the_first_evaluation_at_or_above_the_target():
    assert convergence.first_reach(EXACT["evals"], 0.80)["epoch"] == 4
    assert convergence.first_reach(EXACT["evals"], 0.81)["mb"] == 30.0
    assert convergence.first_reach(EXACT["evals"], 0.95) is None
    # a peak then a dip: the first crossing counts
    dip = _evals([(1, 1.0, 0.7), (2, 2.0, 0.9), (3, 3.0, 0.85)])
    assert convergence.first_reach(dip, 0.88)["epoch"] == 2


def test_accuracy_at_mb_takes_the_last_evaluation_within_the_budget_without_interpolating():
    assert convergence.accuracy_at_mb(EXACT["evals"], 25.0) == 0.80
    assert convergence.accuracy_at_mb(EXACT["evals"], 20.0) == 0.80
    assert convergence.accuracy_at_mb(EXACT["evals"], 9.99) is None
    assert convergence.accuracy_at_mb(CHEAP["evals"], 1.5) == 0.88


def test_common_target_and_budget_are_the_worst_final_accuracy_and_the_cheapest_total():
    rows = [EXACT, CHEAP]
    assert convergence.common_target(rows) == pytest.approx(0.88)
    assert convergence.common_budget(rows) == 1.5
    # floored to 0.1 pp, so every row reaches it
    odd = _row("x", [(1, 1.0, 0.87654)])
    assert convergence.common_target([odd]) == pytest.approx(0.876)
    assert convergence.first_reach(odd["evals"], convergence.common_target([odd])) is not None
    failed = {"label": "y", "error": "diverged: nan"}
    assert convergence.common_target([EXACT, failed]) == pytest.approx(0.90)


def test_equal_bytes_table_reports_reach_and_accuracy_at_the_common_budget():
    table, target, budget = convergence.equal_bytes_table([EXACT, CHEAP])
    lines = table.strip().splitlines()
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "first reaches 88.00 % at" in lines[0] and "first reaches 85.00 % at" in lines[0]
    assert "acc after 1.5 MB / peer" in lines[0]
    exact_line, cheap_line = lines[2], lines[3]
    assert "30 MB (epoch 6)" in exact_line and "n/a" in exact_line  # nothing measured within 1.5 MB
    assert "1.5 MB (epoch 6)" in cheap_line and cheap_line.endswith("88.00 % |")
    best = convergence.cheapest_to_reach([EXACT, CHEAP], target)
    assert best["label"] == CHEAP["label"] and best["reach"]["mb"] == 1.5
    assert convergence.cheapest_to_reach([EXACT, CHEAP], 0.99) is None


def test_gap_table_and_the_setting_that_closes_the_gap():
    exact = _row("exact gossip", [(6, 30.0, 0.90)], spec="exact")
    r1 = _row("PowerGossip r1 (1 iter)", [(6, 1.0, 0.89)], acc_local_mean=0.85, acc_local_min=0.80)
    r2 = _row("PowerGossip r2 (1 iter)", [(6, 2.0, 0.895)], acc_local_mean=0.885)
    r4 = _row("PowerGossip r4 (1 iter)", [(6, 4.0, 0.90)], acc_local_mean=0.889)
    gaps = convergence.gaps(r1, exact)
    assert gaps["acc_local_mean"] == pytest.approx(100 * (0.89 - 0.85))
    assert gaps["acc_avg"] == pytest.approx(1.0)
    table = convergence.gap_table([r1, r2, r4], exact)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert (
        "| PowerGossip r1 (1 iter) | 85.00 % | 80.00 % | 89.00 % | 1.000 | +4.00 pp | +1.00 pp |"
        in table
    )
    # r2 is within 1 pp of exact's local mean (0.89 - 0.885 = 0.5 pp) and cheaper than r4
    assert convergence.closing_setting([r1, r2, r4], exact)["label"] == r2["label"]
    verdict = "\n".join(convergence.gap_verdict([r1, r2, r4], exact))
    assert (
        "**PowerGossip r2 (1 iter)**" in verdict
        and "2.0× PowerGossip r1 (1 iter)'s bytes" in verdict
    )
    assert "93.3 % fewer" in verdict  # 2 MB vs exact's 30 MB
    none = "\n".join(convergence.gap_verdict([r1], exact))
    assert "No setting of the grid" in none


def test_combine_averages_the_histories_of_the_seeds():
    a = dict(CHEAP, seed=0)
    b = dict(_row(CHEAP["label"], [(2, 0.5, 0.55), (4, 1.0, 0.80), (6, 1.5, 0.90)]), seed=1)
    both = combine([a, b])
    assert both["seed_list"] == [0, 1]
    assert [e["acc_avg"] for e in both["evals"]] == pytest.approx([0.50, 0.79, 0.89])
    assert [e["mb"] for e in both["evals"]] == [0.5, 1.0, 1.5]
    assert both["curve"][-1] == (1.5, pytest.approx(0.89))


def _wide(exact_acc, pg_acc, pg_mb_per_step):
    exact = _row(
        "exact gossip, mlp:512,512", [(30, 1000.0, exact_acc)], mb_per_step=1.0, model="mlp:512,512"
    )
    pg = _row(
        "PowerGossip r1 (1 iter), mlp:512,512",
        [(30, 8.0, pg_acc)],
        mb_per_step=pg_mb_per_step,
        model="mlp:512,512",
    )
    return [exact, pg]


def test_wide_model_target_needs_both_the_byte_saving_and_the_accuracy():
    met = "\n".join(state.targets([], [], _wide(0.66, 0.655, 1 / 139)))
    assert "≥ 99 % fewer bytes at ≤ 1 pp accuracy, wide model** (mlp:512,512" in met
    assert "MET — PowerGossip r1 sends 99.28 % fewer bytes (139× less) at 65.50 %" in met
    assert "gap +0.50 pp" in met
    inaccurate = "\n".join(state.targets([], [], _wide(0.66, 0.60, 1 / 139)))
    assert (
        "MISSED — PowerGossip r1 sends 99.28 % fewer" in inaccurate and "gap +6.00 pp" in inaccurate
    )
    heavy = "\n".join(state.targets([], [], _wide(0.66, 0.66, 1 / 50)))
    assert "MISSED — PowerGossip r1 sends 98.00 % fewer" in heavy


def test_cnn_target_counts_the_reference_runs():
    ref = dict(_row("exact gossip", [(100, 50.0, 0.905)]), model_kind="reference")
    text = "\n".join(state.targets([EXACT, CHEAP], [], [], [ref]))
    assert (
        "≥ 90 %**: MET — best averaged-model accuracy 90.50 % (exact gossip, ring:8 iid, 100 epochs)"
        in text
    )
    text = "\n".join(state.targets([dict(EXACT, acc_avg=0.89)], [], [], []))
    assert "≥ 90 %**: MISSED" in text


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


def test_curves_csv_has_one_line_per_evaluation():
    text = state.curves_csv(
        [
            dict(EXACT, model_kind="iid", seed=0),
            dict(CHEAP, seed=1),
            {"label": "z", "error": "x", "topology": "ring:8", "partition": "iid"},
        ]
    )
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 6 and rows[0]["group"] == "iid" and rows[3]["seed"] == "1"
    assert float(rows[2]["mb_sent_per_peer"]) == 30.0 and float(rows[5]["acc_avg"]) == 0.88


def test_epoch_budget_says_at_or_near_the_plateau_from_the_reference_runs():
    plan = {"epochs": 6, "reference_epochs": 100, "topology": "ring:8", "iid": "iid"}
    short = dict(EXACT, seed=0)
    for reference_acc, expected in ((0.904, "at the plateau"), (0.93, "up to 3.00 pp below")):
        ref = dict(_row("exact gossip", [(100, 50.0, reference_acc)]), model_kind="reference")
        text = state.epoch_budget({"plan": plan, "iid": [short], "reference": [ref]})
        assert expected in text and "exact gossip 90.00 % after 6 epochs" in text


def _quick_rows(done=None):
    """Rows of the quick plan (or of its first `done` runs) made of synthetic measurements."""
    runs = design.plan(True, {})[:done]
    records = []
    for i, run in enumerate(runs):
        c = run.config
        row = _row(c["label"], [(1, 0.01 * (i + 1), 0.80 + 0.01 * i)], spec=c["train"]["algorithm"])
        row.update(model_kind=c["kind"], partition=c["train"]["partition"], topology="ring:4")
        row.update(seed=run.seed, gamma=None, epochs=1, model="logreg", peers=4, steps=13)
        records.append(
            Record(run.key, dict(c), run.seed, True, row, "abc1234", "2026-12-04 12:00 UTC", 2.0)
        )
    return Rows("training", True, records, len(design.plan(True, {})))


def test_the_page_from_rows_has_curves_both_plots_and_the_non_iid_sections():
    outputs = state.render(_quick_rows())
    page = outputs["training.md"]
    assert page.startswith("# Decentralized training: accuracy vs bytes, to convergence (--quick)")
    assert (
        "Generated by `python -m experiments training --quick`: 4 run(s) at commit abc1234" in page
    )
    assert "Partial page" not in page and "## The non-IID gap (ring:4, dirichlet:0.5" in page
    assert "| ring:4 | dirichlet:0.5 | exact gossip | topology | 1 | 1 | 82.00 % |" in page
    assert "Equal bytes, ring:4 iid" in page and "first reaches" in page
    assert "(the runs' own wall times, summed): iid, first seed 4 s; Dirichlet" in page
    curves = list(csv.DictReader(io.StringIO(outputs["training_curves.csv"])))
    runs = list(csv.DictReader(io.StringIO(outputs["training.csv"])))
    assert len(runs) == 4 and len(curves) == 4  # 1 epoch, evaluated once per run
    assert [r["group"] for r in runs] == ["iid", "iid", "noniid", "noniid"]
    for name in ("training_accuracy_vs_mb.png", "training_accuracy_vs_epochs.png"):
        assert outputs[name].startswith(b"\x89PNG")


def test_a_page_of_unfinished_rows_says_so():
    page = state.render(_quick_rows(done=2))["training.md"]
    assert (
        "**Partial page: 5 of 6 stages finished** (not run: Dirichlet and the non-IID grid)" in page
    )


def test_a_collapsed_row_neither_sets_the_target_nor_counts_as_cheapest():
    fell = _row("Choco top-k 1%", [(2, 0.2, 0.60), (4, 0.4, 0.76), (6, 0.6, 0.09)])
    assert convergence.collapsed(fell) and not convergence.collapsed(EXACT)
    assert convergence.common_target([EXACT, CHEAP, fell]) == pytest.approx(0.88)
    assert convergence.cheapest_to_reach([EXACT, CHEAP, fell], 0.70)["label"] == CHEAP["label"]
    table, _, budget = convergence.equal_bytes_table([EXACT, CHEAP, fell])
    assert budget == 0.6 and "9.00 % (collapsed: peak 76.00 % at epoch 4)" in table
    assert convergence.common_target([fell]) == pytest.approx(
        0.09
    )  # all collapsed: the worst of all
