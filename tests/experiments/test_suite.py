"""experiments/suite (runs.py, tables.py): table building and the projected-time model on synthetic
numbers, the seeds' histories combined; the training page's targets on them. (The pages' --quick runs: tests/experiments/pages/test_every_page.py.)"""

import csv
import io
import math

import pytest

from experiments.pages.training import design
from experiments.pages.training.state import targets
from experiments.suite import runs, tables
from experiments.suite.runs import combine

from tests.experiments.pages.training._support import CHEAP, _row


def _summary(algorithm, mb, steps=100, acc=0.9, compute=2.0, gossip=0.5):
    return {
        "algorithm": algorithm,
        "topology": "ring:8",
        "partition": "iid",
        "model": "cnn1d",
        "peers": 8,
        "epochs": 10,
        "steps": steps,
        "parameters": 11786,
        "final_test_acc_avg_model": acc,
        "final_test_acc_local_mean": acc - 0.01,
        "final_test_acc_local_min": acc - 0.02,
        "mb_sent_per_peer": mb,
        "time_compute_s": compute,
        "time_gossip_compute_s": gossip,
    }


def _rows():
    exact = runs.measurements(
        _summary("exact", 94.3),
        [
            {"rounds": 100, "critical_bytes": 47_150_000},
            {"rounds": 100, "critical_bytes": 47_000_000},
        ],
        5.0,
    )
    pg = runs.measurements(
        _summary("powergossip:rank=1", 3.08, acc=0.895),
        [{"rounds": 100, "critical_bytes": 1_540_000}],
        4.0,
    )
    return [
        dict(exact, label=design.EXACT, gamma_text="topology"),
        dict(pg, label=design.POWERGOSSIP, gamma_text="topology"),
    ]


def test_measurements_take_the_slowest_peer_and_sum_compute():
    exact = _rows()[0]
    assert exact["rounds"] == 100 and exact["critical_bytes"] == 47_150_000
    assert exact["compute_s"] == pytest.approx(2.5)
    assert exact["mb_per_step"] == pytest.approx(0.943)


def test_projected_seconds_is_compute_plus_rounds_latency_plus_bytes_over_bandwidth():
    exact = _rows()[0]
    bandwidth = 1e9 / 8
    expected = 2.5 + 100 * 50e-6 + 47_150_000 / bandwidth
    assert runs.projected_seconds(exact, bandwidth) == pytest.approx(expected)
    assert runs.projected_seconds(exact, 10e9 / 8) < runs.projected_seconds(exact, bandwidth)


def test_table_ratio_csv_and_targets():
    rows = _rows()
    table = tables.build_table(rows)
    lines = table.strip().splitlines()
    assert lines[0] == tables.TABLE_HEADER and set(lines[1]) == {"|", "-"}
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "30.6× (96.7 % fewer)" in lines[3]
    assert "90.00 %" in lines[2] and "89.50 %" in lines[3]
    parsed = list(csv.DictReader(io.StringIO(tables.build_csv(rows))))
    assert float(parsed[1]["ratio_to_exact"]) == pytest.approx(94.3 / 3.08, rel=1e-3)
    assert float(parsed[0]["projected_s_1gbit"]) == pytest.approx(
        runs.projected_seconds(rows[0], 1e9 / 8), rel=1e-3
    )
    text = "\n".join(targets(rows, rows, []))
    assert "within 1 pp of exact gossip** (ring:8 iid, 1 seed(s), 10 epochs): MET" in text
    assert "≥ 99 % fewer bytes than exact gossip**: MISSED" in text and "Why:" in text
    assert "≥ 90 %**: MET" in text


def test_combine_seeds_mean_and_std():
    a, b = _rows()[0], dict(_rows()[0], acc_avg=0.8)
    both = runs.combine([a, b])
    assert both["seeds"] == 2 and both["acc_avg"] == pytest.approx(0.85)
    assert both["acc_avg_std"] == pytest.approx(math.sqrt(0.005))
    assert "85.00 ± 7.07 %" in tables.build_table([dict(both, label=design.EXACT)])


def test_failed_row_is_reported_not_lost():
    row = {"topology": "ring:8", "partition": "iid", "label": "x", "error": "RuntimeError: boom"}
    table = tables.build_table(_rows() + [row])
    assert "FAILED: RuntimeError: boom" in table


def test_combine_averages_the_histories_of_the_seeds():
    a = dict(CHEAP, seed=0)
    b = dict(_row(CHEAP["label"], [(2, 0.5, 0.55), (4, 1.0, 0.80), (6, 1.5, 0.90)]), seed=1)
    both = combine([a, b])
    assert both["seed_list"] == [0, 1]
    assert [e["acc_avg"] for e in both["evals"]] == pytest.approx([0.50, 0.79, 0.89])
    assert [e["mb"] for e in both["evals"]] == [0.5, 1.0, 1.5]
    assert both["curve"][-1] == (1.5, pytest.approx(0.89))
