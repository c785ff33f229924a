"""experiments/pages/churn/tables.py: the renderer shows every (algorithm, topology, rate) cell next
to the no-churn row, a soak section only when soak rows exist, and says when the sweep is
unfinished. Rows: one --quick sweep."""

from __future__ import annotations

import dataclasses
import re

from experiments.engine import Record, Rows, render
from experiments.pages import pages
from experiments.pages.churn import setting
from experiments.pages.churn.tables import render_page, soak_section


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
