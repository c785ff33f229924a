"""The bandwidth page's logic (experiments/pages/bandwidth): steps to the target, the composition
of times (warm-up steps, evaluations), a step's three figures from measured parts, the answer in
words from the numbers (text.py), the plan's waves (grids, chosen values, seeds), and the
cluster's rows.
The step timer, the recorded messages replayed and a peer alone are in
tests/training/test_timing.py; the page end to end (--quick, its committed rows) in
tests/experiments/pages/test_every_page.py."""

from __future__ import annotations


import pytest

from experiments.pages.bandwidth import figures, recipe, text
from experiments.pages.bandwidth.figures import Schedule, _seeds, accuracy, target_of
from experiments.pages.bandwidth.text import answer


# ---- steps to the target and the composed times ------------------------------------------------
def test_first_reach_is_the_first_evaluation_at_or_above_the_target():
    evals = [[36, 0.50, 1.0], [72, 0.7499999, 2.0], [108, 0.75, 3.0], [144, 0.80, 4.0]]
    assert figures.first_reach(evals, 0.75) == (108, 3.0)
    assert figures.first_reach(evals, 0.50) == (36, 1.0)
    assert figures.first_reach(evals, 0.81) is None
    assert figures.evaluations_until(evals, 108) == 3
    assert figures.evaluations_until(evals, 107) == 2


def test_common_target_is_the_highest_whole_percent_every_run_reaches():
    assert figures.common_target([0.7349, 0.81, 0.79]) == 0.73
    assert figures.common_target([0.73]) == 0.73  # 100 * 0.73 is 72.999... in binary
    assert figures.common_target([0.7999999999, 0.9]) == 0.79


def test_a_schedule_charges_warm_up_steps_at_their_own_cost_and_every_evaluation():
    plan = Schedule(per_step=2.0, warm_steps=10, warm_per_step=5.0, per_eval=7.0)
    assert plan.training(4) == 20.0  # all inside the warm-up
    assert plan.training(25) == 10 * 5.0 + 15 * 2.0
    assert plan.until(25, 3) == 80.0 + 21.0
    assert Schedule(per_step=0.5).training(720) == 360.0


def test_seconds_to_target_per_seed_count_the_evaluations_up_to_the_one_that_reaches_it():
    seed0 = [[36, 0.6, 1], [72, 0.8, 2], [108, 0.85, 3]]
    seed1 = [[36, 0.6, 1], [72, 0.7, 2], [108, 0.79, 3]]
    plan = Schedule(per_step=0.1, per_eval=3.0)
    assert figures.per_seed_times([seed0, seed1], 0.8, plan) == pytest.approx([7.2 + 6.0, None])
    assert _seeds([13.2, None])["mean"] is None  # a seed that never reaches it: no mean
    curve = figures.mean_curve([seed0, seed1])
    assert [step for step, _ in curve] == [36, 72, 108]
    assert [acc for _, acc in curve] == pytest.approx([0.6, 0.75, 0.82], abs=1e-15)
    with pytest.raises(ValueError, match="different steps"):
        figures.mean_curve([seed0, [[35, 0.6, 1]]])


# ---- a step's three figures ---------------------------------------------------------------------
TIMING = {
    "wall": [1.0, 1.3, 1.1],
    "wall_mean": [1.1, 1.4, 1.2],
    "compute": [0.5, 0.6, 0.55],
    "arith": [0.1, 0.1, 0.1],
    "cpu": [0.2, 0.2, 0.2],
    "comm": [0.4, 0.6, 0.5],
    "replay": [0.9, 0.7, 2.0],
    "rounds": [2, 2, 2],
    "critical_bytes": [1_000_000, 1_250_000, 1_000_000],
    "bytes_sent": [2_000_000, 2_500_000, 2_000_000],
}
ALONE = {"cpu": 0.05, "arith": 0.01, "eval_cpu": 0.3}


def test_step_costs_compose_the_measured_parts_as_documented():
    c = figures.step_costs(TIMING, ALONE, "10mbit")
    assert (c["measured"], c["measured_median"]) == (1.4, 1.3)  # the slowest host's mean, median
    assert c["core_each"] == pytest.approx(0.05 + 0.9)  # CPU alone + the replays' median
    projected = 2 * figures.LATENCY_S + 1_250_000 * 8 / 1e7
    assert c["comm_projected"] == pytest.approx(projected)
    assert c["projected"] == pytest.approx(0.05 + projected)
    assert c["comm_egress"] == pytest.approx(2_500_000 * 8 / (1e7 * 1448 / 1514))
    # a ring host sends its two messages through one link: the egress model is twice the
    # projection, which charges an exchange its largest message only
    assert c["comm_egress"] / c["comm_projected"] == pytest.approx(2 * 1514 / 1448, rel=1e-3)
    e = figures.eval_costs(
        {"eval": {"seconds": [4.0, 5.0], "replay": [3.0], "metric_bytes": [8, 9]}}, ALONE
    )
    assert (e["measured"], e["core_each"], e["metric_bytes"]) == (5.0, pytest.approx(3.3), 9)


def test_rates_and_durations_read_as_written():
    assert figures.rate_bits("1gbit") == 1e9 and figures.rate_bits("10mbit") == 1e7
    assert text.rate_text("100mbit") == "100 Mbit/s"
    assert [text.seconds_text(s) for s in (0.84, 90, 7200, 3 * 86400)] == [
        "0.84 s",
        "1.5 min",
        "2 h",
        "3 d",
    ]


# ---- the answer in words ------------------------------------------------------------------------
RATES = ("1gbit", "100mbit", "10mbit", "1mbit")
TIMES = {
    "1gbit": {"pg-r1": 10.0, "exact": 5.0, "allreduce": 4.0},
    "100mbit": {"pg-r1": 10.0, "exact": 20.0, "allreduce": 12.0},
    "10mbit": {"pg-r1": 11.0, "exact": 200.0, "allreduce": 120.0},
    "1mbit": {"pg-r1": 20.0, "exact": None, "allreduce": 1200.0},
}


def test_the_answer_names_the_rates_and_factors_computed_from_the_times():
    line = text.compare_line(TIMES, RATES)  # PowerGossip r1 against exact gossip
    assert line == (
        "PowerGossip r1 reaches it before exact gossip at 100 Mbit/s (2× sooner), 10 Mbit/s "
        "(18.2× sooner), 1 Mbit/s (exact gossip never reaches it) and not at 1 Gbit/s "
        "(exact gossip 2× sooner)."
    )
    assert text.fastest(TIMES["1gbit"]) == "allreduce"


def _timed(per_rate):
    """figures.times' shape for ring:8 from {rate: {algorithm: seconds}}."""
    cells = {}
    for rate, per in per_rate.items():
        cells[rate] = {
            k: {f: {"mean": v} for f in ("core_each", "measured", "core_each_with_evals")}
            for k, v in per.items()
        }
    return {"ring:8": cells}


def test_the_answer_section_is_drawn_from_the_core_each_figure():
    s = recipe.FULL
    lines = answer(s, _timed(TIMES), 0.75)
    assert lines[0].startswith("**ring:8**, to 75 %, hosts with a core each (training time): ")
    assert "before exact gossip at 100 Mbit/s (2× sooner)" in lines[0]
    assert "before all-reduce at 100 Mbit/s (1.2× sooner)" in lines[0]
    assert lines[1] == (
        "Fastest to 75 % at each rate (ring:8, core each): 1 Gbit/s: all-reduce, 100 Mbit/s: "
        "PowerGossip r1, 10 Mbit/s: PowerGossip r1, 1 Mbit/s: PowerGossip r1."
    )
    assert lines[2].endswith("the same verdicts.")


def test_a_chosen_value_at_its_grids_end_is_said_and_a_one_point_grid_has_no_end():
    from experiments.pages._markdown import grid_end

    assert [grid_end(v, (0.1, 0.2, 0.4)) for v in (0.1, 0.2, 0.4)] == ["smallest", "", "largest"]
    assert grid_end(0.4, (0.4,)) == ""  # exact gossip with H = 4: one point, nothing beyond it


# ---- the plan's waves ---------------------------------------------------------------------------
def _trained(acc, steps=720):
    return {"acc_avg": acc, "steps": steps, "steps_per_epoch": 36, "evals": [[steps, acc, 1.0]]}


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
    main = {r.key: r for r in recipe.main_runs(s, rows)}
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
    torus = sorted(r.key for r in recipe.main_runs(s, rows) if "torus" in r.key)
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


def test_quick_without_the_clusters_privileges_says_what_it_did_not_measure(tmp_path, monkeypatch):
    """Where namespaces cannot be made (no root), --quick makes every row all the same: the step
    times and the complete runs say why they are missing, and the page says they were not run."""
    from experiments.engine import RowFile, sweep
    from experiments.pages import pages
    from experiments.pages.bandwidth import rows

    monkeypatch.setattr(rows, "cluster_problem", lambda: "no CAP_NET_ADMIN (uid 1000)")
    sweep(pages()["bandwidth"], tmp_path, quick=True)
    stored = RowFile(tmp_path / "bandwidth.jsonl").read()
    skipped = [k for k, r in stored.items() if "skipped" in r.row]
    assert skipped == ["timing/ring:2/10mbit", "e2e/ring:2/pg-r1/10mbit", "fault/torch/kill"]
    page = (tmp_path / "bandwidth.md").read_text()
    assert "Not run: no CAP_NET_ADMIN (uid 1000)" in page
    assert "## The answer\n\nNot measured" in page
    assert not (tmp_path / "bandwidth.png").exists()


def test_an_all_reduce_and_the_evaluation_are_measured_once_for_every_topology():
    """Their rings go through all hosts whatever the gossip topology: torus:2x4 is not timed for
    them, and takes ring:8's measurements at the same rate."""
    from experiments.pages.bandwidth.figures import costs

    s = recipe.FULL
    runs = recipe.measurement_runs(s, {})
    torus = next(r for r in runs if r.key == "timing/torus:2x4/10mbit").config
    assert [a["key"] for a in torus["algorithms"]] == ["exact", "pg-r1"]
    assert torus["eval"] is False
    assert "alone/torus:2x4/allreduce" not in {r.key for r in runs}
    entry = dict(TIMING, periods=5, wall_min=[0.5], wall_max=[2.0])
    evaluation = {"seconds": [4.0], "cpu": [1.0], "replay": [3.0], "metric_bytes": [9]}
    common = {"load_before": [1, 1, 1], "load_after": [1, 1, 1]}
    data = {
        "timing/ring:8/10mbit": {
            "algorithms": {"exact": entry, "allreduce": dict(entry, wall_mean=[9.0])},
            "eval": evaluation,
            **common,
        },
        "timing/torus:2x4/10mbit": {"algorithms": {"exact": entry}, **common},
        "alone/ring:8/exact": ALONE,
        "alone/ring:8/allreduce": ALONE,
        "alone/torus:2x4/exact": dict(ALONE, cpu=0.5),
    }
    c = costs(s, data)
    ring, torus = c["ring:8"]["10mbit"], c["torus:2x4"]["10mbit"]
    assert torus["borrowed"] == {"allreduce": "ring:8"} and ring["borrowed"] == {}
    assert torus["steps"]["allreduce"] == ring["steps"]["allreduce"]
    assert torus["steps"]["allreduce"]["measured"] == 9.0
    assert torus["steps"]["exact"]["core_each"] == pytest.approx(0.5 + 0.9)  # its own alone
    assert torus["eval"] == ring["eval"] and ring["eval"]["core_each"] == pytest.approx(3.3)


# ---- faults across hosts ----------------------------------------------------------------------
def _fault(seconds, named, said=None):
    exits = {"0": seconds, "1": 0.01, "2": seconds}
    return {
        "seconds": seconds,
        "exits": exits,
        "named_after": seconds and seconds - 0.1,
        "named": named,
        "errors": [],
        "lost_says": said,
        "bound": 23.0,
        "left": [],
    }


def test_the_fault_section_shows_each_case_and_says_which_missed_30_s():
    from experiments.pages.bandwidth import faults

    cases = [("torch", "cut"), ("mpi", "kill"), ("mpi", "stop")]
    data = {
        "fault/torch/cut": _fault(12.6, {"0": True, "2": True}, "error (rank 1): this host, h"),
        "fault/mpi/kill": _fault(0.2, {"0": False, "2": False}),
        "fault/mpi/stop": _fault(None, {"0": True, "2": True}),
    }
    text = "\n".join(faults.section(cases, data))
    assert (
        "| torchrun | link cut (`ip link set eth0 down` on the host) | 12.60 | 0: 12.60, 1: "
        in text
    )
    assert "| 0: yes, 2: yes | `this host, h` |" in text
    assert "| mpiexec | its rank SIGKILLed | 0.20 |" in text and "| 0: no, 2: no | — |" in text
    assert "| mpiexec | every process SIGSTOPped | not within 90 s |" in text
    assert "was NOT gone within 30 s in: mpiexec stop" in text
    del data["fault/mpi/stop"]
    assert "was gone within the issue's 30 s in every case" in "\n".join(
        faults.section(cases, data)
    )
    assert faults.section(cases, {}) == []


def test_the_full_plan_ends_with_every_fault_under_both_launchers():
    s = recipe.FULL
    runs = [r for r in recipe.measurement_runs(s, {}) if r.config["kind"] == "fault"]
    assert [r.key for r in runs] == [f"fault/{lc}/{f}" for lc, f in s.faults]
    assert {f for _, f in s.faults} == {"cut", "kill", "stop", "kill-all"}
    assert {lc for lc, _ in s.faults} == {"torch", "mpi"}
    assert all(r.config["quick"] is False for r in runs)
