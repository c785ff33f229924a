"""experiments/pages/churn/__init__.py: the plan converts the churn rate per epoch to the schedule's
per-step rate and is the issue's grid; its rows agree with the schedule they ran and with the
library's own metrics. Rows: one --quick sweep."""

from __future__ import annotations

import math

import pytest

import topologies
from experiments.pages.churn import FULL, JOIN_MODES, grid_row, per_step_rate, plan, setting
from gossip_powersgd.membership.churn import churn_membership, parse_churn


def _grid(rows):
    return [r for r in rows.records if r.config["section"] == "grid"]


def test_the_per_step_rate_is_the_share_per_epoch_over_the_steps_per_epoch():
    assert per_step_rate(0.10, 8) == 0.0125 and per_step_rate(0.0, 8) == 0.0
    # the full page: 4000 MNIST-1D training samples over 16 peers x batch 32 per step
    assert FULL["steps_per_epoch"] == math.ceil(4000 / (16 * 32))
    for quick in (False, True):
        s = setting(quick)
        grid = [r for r in plan(quick, {}) if r.config["section"] == "grid"]
        cells = {
            (r.config["topology"], r.config["label"], r.config["rate_per_epoch"]) for r in grid
        }
        assert len(cells) == len(s["topologies"]) * len(s["algorithms"]) * len(s["rates"])
        assert len(grid) == len(cells) * len(s["seeds"])
        for run in grid:
            schedule = parse_churn(run.config["train"]["churn"])
            assert schedule.rate == run.config["rate_per_epoch"] / s["steps_per_epoch"]
            assert schedule.down == s["down_steps"] and schedule.seed == run.seed


def test_the_full_plan_is_the_issues_grid():
    s = setting(False)
    assert s["rates"] == (0.0, 0.01, 0.05, 0.10) and len(s["seeds"]) >= 3
    assert s["topologies"] == ("ring:16", "exponential:16")
    assert all(topologies.parse(t).size == 16 for t in s["topologies"])
    joins = [r for r in plan(False, {}) if r.config["section"] == "join"]
    assert {r.config["mode"] for r in joins} == set(JOIN_MODES)
    assert {r.seed for r in joins} == set(s["seeds"])


def test_rows_without_churn_have_no_departure_and_no_shift(quick):
    _, rows = quick
    still = [r for r in _grid(rows) if r.config["rate_per_epoch"] == 0.0]
    assert still
    for record in still:
        row = record.row
        assert row["departures"] == row["membership_changes"] == 0
        assert row["average_shift_total"] == 0.0 and row["away_share"] == 0.0
        size = topologies.parse(record.config["train"]["topology"]).size
        assert row["live_peers_at_end"] == size and row["transfer_mb_sent"] == 0.0


def test_churned_rows_made_every_change_of_their_schedule(quick):
    _, rows = quick
    churned = [r for r in _grid(rows) if r.config["rate_per_epoch"] > 0]
    assert churned
    for record in churned:
        row, train = record.row, record.config["train"]
        topology = topologies.parse(train["topology"])
        membership = churn_membership(train["churn"], topology, row["steps"])
        assert row["membership_changes"] == len(membership.epochs) - 1 > 0
        assert row["live_peers_at_end"] == len(membership.epochs[-1].live)
        assert row["departures"] > 0 and row["average_shift_total"] > 0.0
        assert 0.0 < row["away_share"] < 1.0


def test_a_row_refuses_a_run_whose_steps_per_epoch_the_page_got_wrong(quick):
    _, rows = quick
    record = next(r for r in _grid(rows) if r.config["rate_per_epoch"] > 0)
    config = dict(record.config, steps_per_epoch=record.config["steps_per_epoch"] + 1)
    with pytest.raises(RuntimeError, match="fix STEPS_PER_EPOCH|per-step rate assumes"):
        grid_row(config, record.seed)


def test_the_joiners_figures_match_the_librarys_own_metrics(quick):
    _, rows = quick
    s = setting(True)
    joins = [r for r in rows.records if r.config["section"] == "join"]
    assert {(r.config["label"], r.config["mode"]) for r in joins} == {
        (label, mode) for label, _ in s["algorithms"] for mode in JOIN_MODES
    }
    for record in joins:
        row = record.row
        assert row["membership_changes"] == 2 and row["transfer_mb_sent"] > 0
        assert 0.0 <= row["shift_at_join"] <= row["shift_total"]
        probes = row["probes"]
        assert probes[0]["steps_after_join"] == 1  # the join is its epoch's last step
        assert [p["steps_after_join"] for p in probes] == [
            1 + k * s["steps_per_epoch"] for k in range(len(probes))
        ]
        for p in probes:
            assert p["members"] == 4
            # the members' mean squared distance from the copied parameters is the eval record's
            # consensus distance: both are float64 sums of the same squares in other orders
            # (relative rounding ~ parameters x 2^-52, far below 1e-9)
            assert p["members_distance2_mean"] == pytest.approx(p["consensus_distance"], rel=1e-9)
            assert p["others_acc_min"] <= p["others_acc_mean"] <= p["others_acc_max"]
