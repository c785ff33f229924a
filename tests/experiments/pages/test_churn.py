"""The churn page (`python -m experiments churn`): its plan converts the churn rate per epoch to the
schedule's per-step rate, its rows agree with the schedule they ran and with the library's own
metrics, and its renderer shows every (algorithm, topology, rate) cell next to the no-churn row,
the rejoin figures, and a soak section only when soak rows exist. Rows: one --quick sweep."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

import topologies
from experiments.engine import Record, RowFile, Rows, checked_plan, render
from experiments.pages import pages
from experiments.pages.churn import FULL, JOIN_MODES, grid_row, per_step_rate, plan, setting
from experiments.pages.churn.tables import render_page, soak_section
from gossip_powersgd.membership.churn import churn_membership, parse_churn


@pytest.fixture(scope="module")
def quick(quick_sweep):
    sweep = quick_sweep("churn")
    assert sweep.code == 0
    out = sweep.out
    records = RowFile(out / "churn.jsonl").read()
    runs = checked_plan(pages()["churn"], True, {k: r.row for k, r in records.items()})
    rows = Rows("churn", True, [records[r.key] for r in runs], len(runs))
    return out, rows


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


def test_the_table_holds_every_cell_next_to_its_no_churn_row(quick):
    out, rows = quick
    s = setting(True)
    text = (out / "churn.md").read_text()
    lines = [line for line in text.splitlines() if re.match(r"\| (ring|exponential):", line)]
    found = [tuple(c.strip() for c in line.split("|")[1:4]) for line in lines]
    expected = [
        (t, label, f"{100 * rate:g} % ({rate / s['steps_per_epoch']:.4g})")
        for t in s["topologies"]
        for label, _ in s["algorithms"]
        for rate in s["rates"]
    ]
    assert found == expected  # every cell once, the no-churn row first in each group
    for line in lines:
        cells = [c.strip() for c in line.split("|")]
        assert (cells[7] == "—") == cells[3].startswith("0 %")  # Δ vs no churn, on churned rows
    assert "Soak" not in text and "churn.png" in text


def test_a_soak_section_is_drawn_only_from_soak_rows(quick):
    _, rows = quick
    assert soak_section(rows) == ""
    template = rows.records[0]
    fault = dict(host=2, kind="stop", found_as="hung", right_peer=True)
    faults = [
        dict(fault, fault=0, to_membership_line_s=11.0, to_readmission_s=15.0),
        dict(
            fault,
            fault=1,
            host=1,
            kind="kill",
            found_as="killed",
            to_membership_line_s=0.5,
            to_readmission_s=3.0,
        ),
        dict(fault, fault=2, to_membership_line_s=13.0, to_readmission_s=19.0),
    ]
    final = dict(
        hosts=3,
        epochs=40,
        seed=0,
        comm_timeout_s=20.0,
        faults=3,
        members_at_end=[0, 1, 2],
        exit_codes={"0": 0, "1": -9, "2": -9, "2-rejoin0": -9, "1-rejoin1": 0, "2-rejoin2": 0},
        membership_changes=6,
        wall_time_s=1300.0,
        reference_wall_time_s=1200.0,
        steps=400,
        reference_steps=400,
        final_test_acc_avg_model=0.9,
        reference_test_acc_avg_model=0.91,
        load_before=[1.0, 1.0, 1.0],
        load_after=[2.0, 2.0, 2.0],
        cpus=2,
        detection_to_continuation={
            "hung": {"median_s": 1.5, "max_s": 2.0, "n": 2},
            "killed": {"median_s": 0.25, "max_s": 0.25, "n": 1},
        },
    )
    soak = dataclasses.replace(
        template,
        key="soak/cluster:3/seed0",
        config={"section": "soak", "faults": 3},
        row={"rows": faults, "final": final},
    )
    with_soak = Rows("churn", True, [*rows.records, soak], rows.planned + 1)
    section = soak_section(with_soak)
    assert section.startswith("## Soak on the emulated cluster")
    # each host's last process: host 0's first, host 1's restart after fault 1, host 2's after 2
    assert "exited with 0 on 3 of 3 hosts" in section and "3 faults in 21.7 min" in section
    assert "| kill | 1 | killed | 1 of 1 | 0.50 / 0.50 | 3.00 / 3.00 | killed: 0.25 / 0.25 |" in (
        section
    )
    assert "| stop | 2 | hung | 2 of 2 | 12.00 / 13.00 | 17.00 / 19.00 | hung: 1.50 / 2.00 |" in (
        section
    )
    page = render_page(with_soak, setting(True))["churn.md"]
    assert page.endswith(section) and isinstance(soak, Record)
    # a soak that made fewer faults than planned says so
    short = dataclasses.replace(soak, config={"section": "soak", "faults": 4})
    text = soak_section(Rows("churn", True, [*rows.records, short], rows.planned + 1))
    assert "3 faults (of 4 planned: the pause before the next one ended past 85 % of the" in text


def test_an_unfinished_sweep_says_so(quick):
    out, rows = quick
    partial = Rows("churn", True, rows.records[:-3], rows.planned)
    text = render_page(partial, setting(True))["churn.md"]
    assert f"{len(rows.records) - 3} of {rows.planned} planned runs" in text
    assert render(pages()["churn"], out)  # the complete page draws again from its rows
