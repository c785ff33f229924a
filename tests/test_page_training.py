"""experiments/suite: the equal-bytes comparison (first reach of a target, accuracy within a byte
budget), the non-IID gap table, seed-averaged histories, the wide-model target and the plan's
checks, all on synthetic rows with known answers (no training)."""

import csv
import io

import pytest

from experiments import suite
from experiments.suite import training_markdown, training_plots


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
    assert suite.first_reach(EXACT["evals"], 0.80)["epoch"] == 4
    assert suite.first_reach(EXACT["evals"], 0.81)["mb"] == 30.0
    assert suite.first_reach(EXACT["evals"], 0.95) is None
    # a peak then a dip: the first crossing counts
    dip = _evals([(1, 1.0, 0.7), (2, 2.0, 0.9), (3, 3.0, 0.85)])
    assert suite.first_reach(dip, 0.88)["epoch"] == 2


def test_accuracy_at_mb_takes_the_last_evaluation_within_the_budget_without_interpolating():
    assert suite.accuracy_at_mb(EXACT["evals"], 25.0) == 0.80
    assert suite.accuracy_at_mb(EXACT["evals"], 20.0) == 0.80
    assert suite.accuracy_at_mb(EXACT["evals"], 9.99) is None
    assert suite.accuracy_at_mb(CHEAP["evals"], 1.5) == 0.88


def test_common_target_and_budget_are_the_worst_final_accuracy_and_the_cheapest_total():
    rows = [EXACT, CHEAP]
    assert suite.common_target(rows) == pytest.approx(0.88)
    assert suite.common_budget(rows) == 1.5
    # floored to 0.1 pp, so every row reaches it
    odd = _row("x", [(1, 1.0, 0.87654)])
    assert suite.common_target([odd]) == pytest.approx(0.876)
    assert suite.first_reach(odd["evals"], suite.common_target([odd])) is not None
    failed = {"label": "y", "error": "diverged: nan"}
    assert suite.common_target([EXACT, failed]) == pytest.approx(0.90)


def test_equal_bytes_table_reports_reach_and_accuracy_at_the_common_budget():
    table, target, budget = suite.equal_bytes_table([EXACT, CHEAP])
    lines = table.strip().splitlines()
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "first reaches 88.00 % at" in lines[0] and "first reaches 85.00 % at" in lines[0]
    assert "acc after 1.5 MB / peer" in lines[0]
    exact_line, cheap_line = lines[2], lines[3]
    assert "30 MB (epoch 6)" in exact_line and "n/a" in exact_line  # nothing measured within 1.5 MB
    assert "1.5 MB (epoch 6)" in cheap_line and cheap_line.endswith("88.00 % |")
    best = suite.cheapest_to_reach([EXACT, CHEAP], target)
    assert best["label"] == CHEAP["label"] and best["reach"]["mb"] == 1.5
    assert suite.cheapest_to_reach([EXACT, CHEAP], 0.99) is None


def test_gap_table_and_the_setting_that_closes_the_gap():
    exact = _row("exact gossip", [(6, 30.0, 0.90)], spec="exact")
    r1 = _row("PowerGossip r1 (1 iter)", [(6, 1.0, 0.89)], acc_local_mean=0.85, acc_local_min=0.80)
    r2 = _row("PowerGossip r2 (1 iter)", [(6, 2.0, 0.895)], acc_local_mean=0.885)
    r4 = _row("PowerGossip r4 (1 iter)", [(6, 4.0, 0.90)], acc_local_mean=0.889)
    gaps = suite.gaps(r1, exact)
    assert gaps["acc_local_mean"] == pytest.approx(100 * (0.89 - 0.85))
    assert gaps["acc_avg"] == pytest.approx(1.0)
    table = suite.gap_table([r1, r2, r4], exact)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert (
        "| PowerGossip r1 (1 iter) | 85.00 % | 80.00 % | 89.00 % | 1.000 | +4.00 pp | +1.00 pp |"
        in table
    )
    # r2 is within 1 pp of exact's local mean (0.89 - 0.885 = 0.5 pp) and cheaper than r4
    assert suite.closing_setting([r1, r2, r4], exact)["label"] == r2["label"]
    verdict = "\n".join(suite.gap_verdict([r1, r2, r4], exact))
    assert (
        "**PowerGossip r2 (1 iter)**" in verdict
        and "2.0× PowerGossip r1 (1 iter)'s bytes" in verdict
    )
    assert "93.3 % fewer" in verdict  # 2 MB vs exact's 30 MB
    none = "\n".join(suite.gap_verdict([r1], exact))
    assert "No setting of the grid" in none


def test_combine_averages_the_histories_of_the_seeds():
    a = dict(CHEAP, seed=0)
    b = dict(_row(CHEAP["label"], [(2, 0.5, 0.55), (4, 1.0, 0.80), (6, 1.5, 0.90)]), seed=1)
    both = suite.combine([a, b])
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
    met = "\n".join(suite.targets([], [], _wide(0.66, 0.655, 1 / 139)))
    assert "≥ 99 % fewer bytes at ≤ 1 pp accuracy, wide model** (mlp:512,512" in met
    assert "MET — PowerGossip r1 sends 99.28 % fewer bytes (139× less) at 65.50 %" in met
    assert "gap +0.50 pp" in met
    inaccurate = "\n".join(suite.targets([], [], _wide(0.66, 0.60, 1 / 139)))
    assert (
        "MISSED — PowerGossip r1 sends 99.28 % fewer" in inaccurate and "gap +6.00 pp" in inaccurate
    )
    heavy = "\n".join(suite.targets([], [], _wide(0.66, 0.66, 1 / 50)))
    assert "MISSED — PowerGossip r1 sends 98.00 % fewer" in heavy


def test_cnn_target_counts_the_reference_runs():
    ref = dict(_row("exact gossip", [(100, 50.0, 0.905)]), model_kind="reference")
    text = "\n".join(suite.targets([EXACT, CHEAP], [], [], [ref]))
    assert (
        "≥ 90 %**: MET — best averaged-model accuracy 90.50 % (exact gossip, ring:8 iid, 100 epochs)"
        in text
    )
    text = "\n".join(suite.targets([dict(EXACT, acc_avg=0.89)], [], [], []))
    assert "≥ 90 %**: MISSED" in text


def test_plan_rejects_bad_budgets_with_one_line_errors():
    with pytest.raises(ValueError, match="--choco-seeds must be in"):
        suite.training_plan(False, seeds=2, choco_seeds=3)
    with pytest.raises(ValueError, match="--epochs must be at least 2"):
        suite.training_plan(False, epochs=1)
    plan = suite.training_plan(False, epochs=60, reference_epochs=60)
    assert plan["reference_rows"] == [] and plan["seeds"] == (0, 1, 2)
    quick = suite.training_plan(True)
    assert {spec for _, spec in quick["rows"]} == {"exact", "powergossip:rank=1,iters=1"}


def test_partial_page_says_which_stages_did_not_run():
    state = {
        "stage_seconds": {"γ sweep": 12.0},
        "sweeps": [EXACT],
        "iid": [],
        "noniid": [],
        "noniid_extra": [],
        "wide": [],
        "reference": [],
    }
    text = training_markdown.running_time(state, done=1)
    assert text.startswith("**Partial page: 1 of 6 stages finished**") and "γ sweep 12 s" in text
    assert "1 training runs" in text
    assert "Partial" not in training_markdown.running_time(dict(state), done=6)


def test_curves_csv_has_one_line_per_evaluation():
    text = training_plots.curves_csv(
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
        text = training_markdown.epoch_budget({"plan": plan, "iid": [short], "reference": [ref]})
        assert expected in text and "exact gossip 90.00 % after 6 epochs" in text


def test_quick_training_writes_curves_both_plots_and_the_non_iid_sections(tmp_path):
    assert suite.main(["training", "--quick", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "training.md").read_text()
    assert "Partial page" not in page and "## The non-IID gap (ring:4, dirichlet:0.5" in page
    assert "| ring:4 | dirichlet:0.5 | exact gossip | topology | 1 | 1 |" in page
    assert "Equal bytes, ring:4 iid" in page and "first reaches" in page
    curves = list(csv.DictReader(io.StringIO((tmp_path / "training_curves.csv").read_text())))
    runs = list(csv.DictReader(io.StringIO((tmp_path / "training.csv").read_text())))
    assert len(runs) == 4 and len(curves) == 4  # 1 epoch, evaluated once per run
    assert {r["group"] for r in runs} == {"iid", "noniid"}
    for name in ("training_accuracy_vs_mb.png", "training_accuracy_vs_epochs.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_a_collapsed_row_neither_sets_the_target_nor_counts_as_cheapest():
    fell = _row("Choco top-k 1%", [(2, 0.2, 0.60), (4, 0.4, 0.76), (6, 0.6, 0.09)])
    assert suite.collapsed(fell) and not suite.collapsed(EXACT)
    assert suite.common_target([EXACT, CHEAP, fell]) == pytest.approx(0.88)
    assert suite.cheapest_to_reach([EXACT, CHEAP, fell], 0.70)["label"] == CHEAP["label"]
    table, _, budget = suite.equal_bytes_table([EXACT, CHEAP, fell])
    assert budget == 0.6 and "9.00 % (collapsed: peak 76.00 % at epoch 4)" in table
    assert suite.common_target([fell]) == pytest.approx(0.09)  # all collapsed: the worst of all


def test_render_only_draws_the_same_page_from_the_runs_csvs(tmp_path):
    assert suite.main(["training", "--quick", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "training.md").read_text()
    csv_before = (tmp_path / "training.csv").read_text()
    assert suite.main(["training", "--quick", "--render-only", "--out", str(tmp_path)]) == 0
    again = (tmp_path / "training.md").read_text()
    assert "Drawn again from the run's training.csv and training_curves.csv" in again
    # the run's own sentence (command, date, seconds, commit) is kept; every other line is identical
    assert page.splitlines()[2].split(" Backend:")[0] in again.splitlines()[2]
    assert [l for i, l in enumerate(page.splitlines()) if i != 2] == [
        l for i, l in enumerate(again.splitlines()) if i != 2
    ]
    assert (tmp_path / "training.csv").read_text() == csv_before


def test_render_only_needs_a_page_this_suite_wrote(tmp_path):
    with pytest.raises(ValueError, match="training.md is missing"):
        suite.main(["training", "--render-only", "--out", str(tmp_path)])
    from experiments.suite.training_render import run_header

    with pytest.raises(ValueError, match="no 'Generated by' sentence"):
        run_header("# some other page\n")
    generated, command, stages, done = run_header(
        "Generated by `python -m experiments.suite training --epochs 6` on 2026-12-01 11:22 UTC in 243 s "
        "(commit 24dae66). Backend: ...\n\n**Partial page: 2 of 6 stages finished** (not run: x). "
        "Running time by stage: γ sweep 243 s; iid, first seed 900 s; 9 training runs in all, one"
    )
    assert command == "python -m experiments.suite training --epochs 6" and done == 2
    assert stages == {"γ sweep": 243.0, "iid, first seed": 900.0} and generated.endswith(
        "(commit 24dae66)."
    )
