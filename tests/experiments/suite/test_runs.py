"""experiments/suite/runs.py: a run's measurements (the slowest peer's rounds and bytes, compute summed),
the projected-time model, the seeds combined (mean and std, and their histories), on synthetic numbers."""

from __future__ import annotations

import math

import pytest

from experiments.pages.training import design
from experiments.suite import runs, tables
from experiments.suite.runs import combine

from tests.experiments.pages.training._support import CHEAP, _row
from tests.experiments.suite._support import _rows


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


def test_combine_seeds_mean_and_std():
    a, b = _rows()[0], dict(_rows()[0], acc_avg=0.8)
    both = runs.combine([a, b])
    assert both["seeds"] == 2 and both["acc_avg"] == pytest.approx(0.85)
    assert both["acc_avg_std"] == pytest.approx(math.sqrt(0.005))
    assert "85.00 ± 7.07 %" in tables.build_table([dict(both, label=design.EXACT)])


def test_combine_averages_the_histories_of_the_seeds():
    a = dict(CHEAP, seed=0)
    b = dict(_row(CHEAP["label"], [(2, 0.5, 0.55), (4, 1.0, 0.80), (6, 1.5, 0.90)]), seed=1)
    both = combine([a, b])
    assert both["seed_list"] == [0, 1]
    assert [e["acc_avg"] for e in both["evals"]] == pytest.approx([0.50, 0.79, 0.89])
    assert [e["mb"] for e in both["evals"]] == [0.5, 1.0, 1.5]
    assert both["curve"][-1] == (1.5, pytest.approx(0.89))
