"""experiments/pages/privacy.py and _privacy.py: the privacy page trains in the regime the DP sweep
chose (its constants, one place), a row combines its seeds, and the page's plateau columns are
computed from each row; on known rows, no training."""

from __future__ import annotations

import math

import pytest

from experiments.engine import Record, Rows
from experiments.pages import _privacy as regime
from experiments.pages import privacy


def test_the_privacy_page_trains_in_the_regime_the_dp_sweep_chose():
    runs = privacy.plan(False, {})
    assert len(runs) == len(privacy.ALGORITHMS) * len(privacy.EPSILONS)
    _, np_batch, _, _, np_epochs, _ = regime.NONPRIVATE
    _, dp_batch, dp_lr, clip, _, _ = regime.CHOSEN
    for run in runs:
        train, target = run.config["train"], run.config["target"]
        assert run.config["seeds"] == list(privacy.SEEDS)
        assert train["dataset"] == regime.DATA and train["topology"] == "ring:8"
        assert train["eval_every"] == train["epochs"] // 4  # quarters: the plateau check
        if target is None:  # the sweep's non-private reference, at the pages' lr
            assert (train["batch_size"], train["lr"], train["epochs"]) == (
                np_batch,
                regime.NONPRIVATE_LR,
                np_epochs,
            )
            assert "dp_target_epsilon" not in train
        else:  # the sweep's recipe, for the budget privacy_dp_budget.md found at each epsilon
            assert (train["batch_size"], train["lr"], train["dp_max_grad_norm"]) == (
                dp_batch,
                dp_lr,
                clip,
            )
            assert train["epochs"] == regime.DP_EPOCHS[target]
            assert train["dp_target_epsilon"] == target and train["dp_delta"] == regime.DELTA
    # `epochs` overrides both kinds of rows (the budget page's cells)
    short = regime.recipe(False, epochs=2)
    assert short["epochs"] == short["dp_epochs"] == 2


def test_a_row_is_the_mean_and_sd_of_its_seeds_and_a_failed_seed_is_left_out(monkeypatch):
    accs = {0: 0.90, 1: 0.80, 2: None}  # seed 2 fails

    def dp_row(c, seed):
        if accs[seed] is None:
            return dict(label=c["label"], seed=seed, error="RuntimeError: boom")
        acc = accs[seed]
        return dict(
            label=c["label"],
            partition="iid",
            target=3.0,
            acc_avg=acc,
            seed=seed,
            acc_local_mean=acc - 0.01,
            acc_3q=acc - 0.02,
            eps_min=2.9 + seed / 100,
            eps_max=2.95 + seed / 100,
            sigma=1.3,
            mb_per_peer=1.0,
        )

    monkeypatch.setattr(regime, "dp_row", dp_row)
    (run,) = [r for r in privacy.plan(False, {}) if r.key == "iid/eps=3/exact gossip"]
    row = privacy.row(run)
    assert row["seeds"] == 2 and "error" not in row
    assert row["acc_avg"] == pytest.approx(0.85) and row["acc_avg_std"] == pytest.approx(
        math.sqrt(0.005)
    )
    assert row["acc_local_mean_std"] == pytest.approx(math.sqrt(0.005))
    assert (row["eps_min"], row["eps_max"]) == (2.9, 2.96)
    assert set(row) <= set(privacy.CSV_FIELDS) | {"acc_local_mean_std"}
    accs.update({0: None, 1: None})  # every seed failed: the row says why
    assert privacy.row(run)["error"] == "RuntimeError: boom"


def _record(label, target, acc, three):
    row = dict(
        partition="iid",
        target=target,
        label=label,
        spec=label,
        seeds=3,
        epochs=15,
        acc_avg=acc,
        acc_avg_std=0.01,
        acc_local_mean=acc,
        acc_local_mean_std=0.01,
        acc_3q=three,
        eps_min=2.99,
        eps_max=2.99,
        sigma=1.33,
        q_min=0.032,
        q_max=0.032,
        mb_per_peer=45.258,
        delta=1e-5,
        steps=480,
        run_seconds=60.0,
    )
    if target is None:
        row.update(eps_min=math.inf, eps_max=math.inf, sigma=None)
    key = f"iid/eps={privacy._eps(target)}/{label}"
    return Record(key, {}, 0, False, row, "abc1234", "2026-12-01 00:00 UTC", 1.0)


def test_the_page_reports_each_rows_last_quarter_and_the_cost_of_privacy():
    records = [
        _record("exact gossip", 3.0, 0.8888, 0.8857),
        _record("exact gossip", None, 0.9505, 0.9489),
    ]
    out = privacy.render(Rows("privacy", False, records, 2))
    page = out["privacy.md"]
    # the change column is the final accuracy minus the one at 3/4 of the run
    assert "| 88.57 % | +0.31 | 88.88 ± 1.00 % | [2.99, 2.99] | 1.33 |" in page
    assert "| iid | ∞ | exact gossip | 3 | 15 | 95.05 ± 1.00 % | 94.89 % | +0.16 |" in page
    assert "- iid, exact gossip: non-private 95.05 %; with DP ε=3: -6.2 pp." in page
    assert out["privacy.csv"].splitlines()[0] == ",".join(privacy.CSV_FIELDS)
    assert out["privacy_accuracy_vs_epsilon.png"][:4] == b"\x89PNG"


def test_rows_made_in_worker_processes_equal_the_in_process_rows_bit_for_bit():
    """A run trains the same in a spawned worker (`--jobs 2`) as in this process: the
    non-private rows (seeded, no secret noise) are equal to the last bit."""
    from experiments.engine import run_pool

    runs = [r for r in privacy.plan(True, {}) if r.config["target"] is None]
    assert len(runs) == 2
    here = [privacy.row(r) for r in runs]
    there = run_pool(privacy.row, [(r,) for r in runs], jobs=2)
    assert [(x["acc_avg"], x["acc_local_mean"]) for x in there] == [
        (x["acc_avg"], x["acc_local_mean"]) for x in here
    ]
