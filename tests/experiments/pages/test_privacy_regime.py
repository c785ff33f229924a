"""experiments/pages/privacy_regime: the plan (every candidate without DP, every (records, model) in
every DP recipe at the target ε), the selection rule on rows made up to test each of its clauses,
the tuning cost's composition checked against each committed run's own ε, and what the committed
page says of privacy_attacks.md's regime (no training)."""

from __future__ import annotations

import math
from pathlib import Path

from experiments.engine import RowFile
from experiments.pages import privacy_regime as sweep
from experiments.pages.privacy_attacks import regimes


RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"


def test_the_plan_is_every_candidate_without_dp_and_every_recipe_per_records_and_model():
    runs = sweep.plan(False, {})
    shapes = {(r, m) for r, m, _ in sweep.CANDIDATES}
    assert len(runs) == len(sweep.CANDIDATES) + len(shapes) * len(sweep.RECIPES)
    assert len({r.key for r in runs}) == len(runs)
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
            recipe = {k: train[k] for k in ("batch_size", "lr", "epochs")}
            assert recipe in sweep.RECIPES and train["dp_max_grad_norm"] == 1.0
    private = [(r.config["records"], r.config["model"]) for r in runs if r.config["target"]]
    assert set(private) == shapes and len(private) == len(shapes) * len(sweep.RECIPES)


def _row(name, target, acc, auc=0.5, nonmembers=4000, batch=128):
    records, model = int(name.split("/")[0]), name.split(" ")[1]
    return dict(
        batch_size=batch,
        lr=1.0,
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
        _row("2000/peer cnn1d 60 epochs", 8.0, 0.75, batch=256),  # its best recipe
        _row("4000/peer cnn1d 30 epochs", None, 0.9, auc=0.51),  # inside its band
        _row("4000/peer cnn1d 30 epochs", 8.0, 0.9),
        _row("1000/peer mlp:256,256 60 epochs", None, 0.7, auc=0.7, nonmembers=1000),  # too few
        _row("1000/peer mlp:256,256 60 epochs", 8.0, 0.95),
        _row("2000/peer mlp:256,256 60 epochs", None, 0.7, auc=0.65),
        _row("2000/peer mlp:256,256 60 epochs", 8.0, 0.5),
    ]
    assert sweep.choose(rows) == "2000/peer cnn1d 60 epochs"
    recipe = dict(batch_size=256, lr=1.0, epochs=60)
    assert sweep.chosen_setting(rows) == dict(records=2000, model="cnn1d", epochs=60, dp=recipe)
    assert sweep.choose(rows[3:5]) is None  # nothing attackable: none chosen
    assert sweep.choose(rows[:1]) is None  # its DP row missing: not chosen


def _committed():
    return sweep.with_recipes(RowFile(RESULTS / "privacy_regime.jsonl").read().values())


def test_the_tuning_cost_of_one_run_is_its_own_epsilon_and_grows_with_every_run():
    """`tuning_epsilon` rebuilds a run's accountant from its row: composing that one run alone
    gives back the ε the run reported (both dp-accounting's PLD at the same discretisation, so to
    its float noise; 1e-9 relative), and every further run on the same records adds to it."""
    rows = [r for r in _committed() if r["target"] is not None]
    assert rows
    for r in rows:
        assert math.isclose(
            sweep.tuning_epsilon([r], r["records"]), max(r["eps_victims"]), rel_tol=1e-9
        )
    for records in {r["records"] for r in rows}:
        mine = [r for r in rows if r["records"] == records]
        assert sweep.tuning_epsilon(rows, records) > max(max(r["eps_victims"]) for r in mine)
        assert sweep.tuning_epsilon(rows, records) == sweep.tuning_epsilon(mine, records)


def test_the_page_says_truly_whether_privacy_attacks_is_measured_in_the_choice():
    rows = _committed()
    attack = sweep.ATTACK_PAGES_REGIME
    assert regimes.MAIN == {k: v for k, v in attack.items() if k != "dp"}
    setting = regimes.REGIMES["privacy_attacks"]["setting"]
    assert setting["dataset"] == sweep.dataset(regimes.MAIN["records"], quick=False)
    assert (setting["model"], setting["epochs"]) == (regimes.MAIN["model"], regimes.MAIN["epochs"])
    assert setting["lr"] == sweep.NONPRIVATE["lr"] and setting["dp"] == dict(
        sweep.DP, **attack["dp"]
    )
    page = (RESULTS / "privacy_regime.md").read_text()
    if sweep.chosen_setting(rows) == attack:
        assert "privacy_attacks.md trains in it" in page and "still measured" not in page
        return
    assert "privacy_attacks.md is still measured in the earlier choice" in page
    # the earlier choice: the rule on the first six candidates and the first recipe alone
    first = sweep.CANDIDATES[:6]
    names, shapes = {sweep.candidate_key(*c) for c in first}, {(r, m) for r, m, _ in first}
    earlier = [
        r
        for r in rows
        if r["candidate"] in names
        or (
            r["target"] is not None
            and (r["records"], r["model"]) in shapes
            and sweep.recipe_of(r) == sweep.RECIPES[0]
        )
    ]
    assert sweep.chosen_setting(earlier) == attack
