"""experiments/pages/bandwidth/render.py: what the page says of how its rows were made (machine time
by kind of run, the commits when there are several, the load and niceness of the timed runs), the
fault section (each case, and which missed 30 s). The whole page from its committed rows, byte for
byte: tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

from experiments.engine import Record, Rows
from experiments.pages.bandwidth.render import faults_section, run_facts


def _record(key, seconds, commit="abc1234", **row):
    return Record(key, {}, 0, False, row, commit, "2026-12-06 10:00 UTC", seconds)


def test_run_facts_sum_time_by_kind_and_name_the_load_of_the_timed_runs():
    records = [
        _record("tune/ring:8/pg-r1/lr=0.1", 30.0),
        _record("train/ring:8/exact/seed0", 90.0),
        _record("timing/ring:8/10mbit", 45.0, load_before=[0.5], load_after=[1.5], nice=0, cpus=2),
        _record("timing/ring:8/1mbit", 15.0, commit="def5678", load_before=[0.25], nice=19, cpus=2),
    ]
    rows = Rows("bandwidth", False, records, len(records))
    facts = run_facts(rows, {r.key: r.row for r in records})
    assert facts["seconds"] == {"tune": 30.0, "train": 90.0, "timing": 60.0}
    sentence = facts["sentence"]
    assert sentence.startswith("Run time by kind of run (each run's own wall time, summed): tune ")
    assert "abc1234: 1 tune, 1 train, 1 timing; def5678: 1 timing" in sentence
    assert "a machine of 2 cores" in sentence and "load average 0.2 to 1.5" in sentence
    assert sentence.endswith(", niceness 0, 19.")
    alone = run_facts(Rows("bandwidth", False, records[:2], 2), {r.key: r.row for r in records[:2]})
    assert "Rows by commit" not in alone["sentence"] and "load" not in alone["sentence"]


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
    cases = [("torch", "cut"), ("mpi", "kill"), ("mpi", "stop")]
    data = {
        "fault/torch/cut": _fault(12.6, {"0": True, "2": True}, "error (rank 1): this host, h"),
        "fault/mpi/kill": _fault(0.2, {"0": False, "2": False}),
        "fault/mpi/stop": _fault(None, {"0": True, "2": True}),
    }
    text = "\n".join(faults_section(cases, data))
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
        faults_section(cases, data)
    )
    assert faults_section(cases, {}) == []
