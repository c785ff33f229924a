"""experiments/pages/bandwidth/recipe.py: the plan's waves (the lr grids, then γ at the chosen lr,
the chosen values, seeds, the topologies with fewer rows), the target set by the compared rows, the
faults that end the full plan."""

from __future__ import annotations

import pytest

from experiments.pages.bandwidth import recipe
from experiments.pages.bandwidth.figures import accuracy, target_of


def _trained(acc, steps=720):
    return {"acc_avg": acc, "steps": steps, "steps_per_epoch": 36, "evals": [[steps, acc, 1.0]]}


def _main_runs(s, rows):
    """The plan's runs on every topology and seed at the chosen values (`train/...`)."""
    return [r for r in recipe.training_runs(s, rows) if r.key.startswith("train/")]


def test_the_plan_tunes_the_lr_first_then_gamma_at_the_chosen_lr():
    s = recipe.FULL
    first = recipe.plan(False, {})
    assert {r.config["train"]["lr"] for r in first} == {0.1, 0.2, 0.4}
    assert all(r.key.split("/")[2] in ("allreduce", "powersgd", "exact-h4") for r in first)
    rows = {r.key: _trained(0.7) for r in first}
    rows["tune/ring:8/allreduce/lr=0.2"] = _trained(0.8)
    rows["tune/ring:8/allreduce/lr=0.4"] = {"error": "diverged: ..."}  # never wins
    second = recipe.plan(False, rows)
    gossip = [r for r in second if r.key.split("/")[2] == "pg-r2"]
    assert [r.config["train"]["lr"] for r in gossip] == [0.2, 0.2]
    ring = recipe.topology_gamma("ring:8")
    assert [r.config["gamma"] for r in gossip] == pytest.approx([0.5 * ring, ring])
    assert recipe.chosen_lr(s, rows) == 0.2


def test_chosen_runs_are_the_tuning_topologys_seed_0_and_the_compared_rows_get_every_seed():
    s = recipe.FULL
    rows = {r.key: _trained(0.7) for r in recipe.plan(False, {})}
    rows.update({r.key: _trained(0.7) for r in recipe.plan(False, rows)})
    rows["tune/ring:8/pg-r1/gx=0.5"] = _trained(0.75)
    assert recipe.main_key(s, "pg-r1", "ring:8", 0, rows) == "tune/ring:8/pg-r1/gx=0.5"
    main = {r.key: r for r in _main_runs(s, rows)}
    torus = main["train/torus:2x4/pg-r1/seed0"]
    assert torus.config["gamma"] == pytest.approx(0.5 * recipe.topology_gamma("torus:2x4"))
    assert "train/ring:8/pg-r1/seed1" in main and "train/ring:8/pg-r2/seed1" not in main
    assert not [r for r in recipe.plan(False, rows) if r.config["kind"] != "train"]


def test_a_topology_with_fewer_rows_trains_its_own_and_takes_the_all_reduces_of_the_ring():
    """torus:2x4 trains exact gossip and PowerGossip r1 only; its all-reduce rows are ring:8's
    (never run again), it is timed at its own rates, and the slowed host times the compared rows."""
    s = recipe.FULL
    rows = {r.key: _trained(0.7) for r in recipe.plan(False, {})}
    rows.update({r.key: _trained(0.7) for r in recipe.plan(False, rows)})
    torus = sorted(r.key for r in _main_runs(s, rows) if "torus" in r.key)
    assert torus == ["train/torus:2x4/exact/seed0", "train/torus:2x4/pg-r1/seed0"]
    assert recipe.algorithms_on(s, "torus:2x4") == ("exact", "pg-r1", "allreduce", "powersgd")
    chosen = recipe.chosen(s, "allreduce", rows)[2]
    assert recipe.main_key(s, "allreduce", "torus:2x4", 0, rows) == chosen
    assert recipe.main_key(s, "allreduce", "ring:8", 1, rows) == "train/ring:8/allreduce/seed1"
    timed = {r.key: r.config for r in recipe.measurement_runs(s, rows)}
    assert [k for k in timed if k.startswith("timing/torus")] == [
        f"timing/torus:2x4/{rate}" for rate in recipe.rates_on(s, "torus:2x4")
    ]
    assert "1mbit" not in recipe.rates_on(s, "torus:2x4") and "1mbit" in s.rates
    slowed = timed["timing/ring:8/100mbit+host3@10mbit"]["algorithms"]
    assert [a["key"] for a in slowed] == ["exact", "pg-r1", "allreduce"]
    assert {k.split("/")[1] for k in timed if k.startswith("alone/")} == {"ring:8", "torus:2x4"}
    assert "alone/torus:2x4/choco-sign" not in timed


def test_an_all_reduces_models_do_not_depend_on_the_graph():
    """What lets torus:2x4 take ring:8's all-reduce and PowerSGD rows: the same config on both
    graphs gives the same models, bit for bit (an all-reduce's result is every peer's mean
    whatever the neighbours; data and seeds depend on the rank and the peer count only)."""
    from gossip_powersgd import run

    base = dict(recipe.QUICK_BASE, epochs=1, lr=0.1, seed=3)
    for algorithm in ("allreduce", "powersgd:rank=1,start_iter=2"):
        ring = run(dict(base, topology="ring:8", algorithm=algorithm))
        torus = run(dict(base, topology="torus:2x4", algorithm=algorithm))
        assert ring.summary["model_sha256"] == torus.summary["model_sha256"]
        assert ring.mb_sent_per_peer == torus.mb_sent_per_peer


def test_the_target_is_set_by_the_compared_rows_only():
    s = recipe.QUICK
    rows = {
        "tune/ring:2/allreduce/lr=0.1": {**_trained(0.9), "evals": [[30, 0.9, 1.0]]},
        "tune/ring:2/exact/gx=1": {**_trained(0.8), "evals": [[15, 0.81, 1.0], [30, 0.8, 2.0]]},
        "tune/ring:2/pg-r1/gx=1": {**_trained(0.7), "evals": [[15, 0.6, 1.0], [30, 0.7259, 2.0]]},
    }
    for row in rows.values():
        row.update(mb_per_peer=1.0, metric_mb_per_peer=0.5, parameters=10)
    acc = accuracy(s, rows, None)
    assert target_of(s, acc) == 0.72  # the best PowerGossip reached, floored
    assert accuracy(s, rows, 0.72)["ring:2"]["exact"]["steps_to_target"] == [15]


def test_the_full_plan_ends_with_every_fault_under_both_launchers():
    s = recipe.FULL
    runs = [r for r in recipe.measurement_runs(s, {}) if r.config["kind"] == "fault"]
    assert [r.key for r in runs] == [f"fault/{lc}/{f}" for lc, f in s.faults]
    assert {f for _, f in s.faults} == {"cut", "kill", "stop", "kill-all"}
    assert {lc for lc, _ in s.faults} == {"torch", "mpi"}
    assert all(r.config["quick"] is False for r in runs)
