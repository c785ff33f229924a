"""experiments/pages/privacy_regime: the plan (every candidate without DP and at the target ε), the
selection rule on rows made up to test each of its clauses, and privacy_attacks.md's regime equal to
the choice its committed rows make (no training)."""

from __future__ import annotations

from pathlib import Path

from experiments.engine import RowFile
from experiments.pages import privacy_regime as sweep
from experiments.pages.privacy_attacks import regimes

RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"


def test_the_plan_is_every_candidate_without_dp_and_one_dp_run_per_records_and_model():
    runs = sweep.plan(False, {})
    shapes = {(r, m) for r, m, _ in sweep.CANDIDATES}
    assert len(runs) == len(sweep.CANDIDATES) + len(shapes)
    for run in runs:
        train, target = run.config["train"], run.config["target"]
        records, model = run.config["records"], run.config["model"]
        assert (records, model) in shapes
        assert train["dataset"] == f"mnist1d:num_samples={records * 10}"  # 8 peers, 20 % test
        assert train["algorithm"] == "exact" and train["topology"] == "ring:8"
        if target is None:
            assert "dp_target_epsilon" not in train and train["lr"] == sweep.NONPRIVATE["lr"]
        else:
            assert train["dp_target_epsilon"] == sweep.TARGET == 8.0
            assert (train["batch_size"], train["epochs"]) == (128, sweep.DP["epochs"])
    assert {(r.config["records"], r.config["model"]) for r in runs if r.config["target"]} == shapes


def _row(name, target, acc, auc=0.5, nonmembers=4000):
    records, model = int(name.split("/")[0]), name.split(" ")[1]
    return dict(
        candidate=name if target is None else None,
        records=records,
        model=model,
        target=target,
        acc_victims=acc,
        auc=auc,
        band_auc=[0.48, 0.52],
        nonmembers=nonmembers,
        epochs=60,
    )


def test_the_rule_takes_the_best_private_accuracy_among_attackable_candidates_with_enough_data():
    rows = [
        _row("2000/peer cnn1d 60 epochs", None, 0.9, auc=0.6),
        _row("2000/peer cnn1d 60 epochs", 8.0, 0.7),
        _row("4000/peer cnn1d 30 epochs", None, 0.9, auc=0.51),  # inside its band
        _row("4000/peer cnn1d 30 epochs", 8.0, 0.9),
        _row("1000/peer mlp:256,256 60 epochs", None, 0.7, auc=0.7, nonmembers=1000),  # too few
        _row("1000/peer mlp:256,256 60 epochs", 8.0, 0.95),
        _row("2000/peer mlp:256,256 60 epochs", None, 0.7, auc=0.65),
        _row("2000/peer mlp:256,256 60 epochs", 8.0, 0.5),
    ]
    assert sweep.choose(rows) == "2000/peer cnn1d 60 epochs"
    assert sweep.chosen_setting(rows) == dict(records=2000, model="cnn1d", epochs=60)
    assert sweep.choose(rows[2:4]) is None  # nothing attackable: none chosen
    assert sweep.choose(rows[:1]) is None  # its DP row missing: not chosen


def test_privacy_attacks_trains_in_the_regime_the_committed_sweep_chose():
    rows = [r.row for r in RowFile(RESULTS / "privacy_regime.jsonl").read().values()]
    assert sweep.chosen_setting(rows) == regimes.MAIN
    setting = regimes.REGIMES["privacy_attacks"]["setting"]
    assert setting["dataset"] == sweep.dataset(regimes.MAIN["records"], quick=False)
    assert (setting["model"], setting["epochs"]) == (regimes.MAIN["model"], regimes.MAIN["epochs"])
    assert setting["lr"] == sweep.NONPRIVATE["lr"] and setting["dp"] == sweep.DP
