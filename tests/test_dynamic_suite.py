"""experiments/suite/dynamic.py: the matched-bits interpolation on hand-made curves, and one
--quick run of `python -m experiments.suite dynamic` (4 peers, tiny problems) writing its page."""

import csv
import io
import json
import math

import pytest

from experiments.suite import dynamic
from experiments.suite.driver import main


def _curve(points):
    return [{"step": k, "bits_per_peer": b, "error": e} for k, (b, e) in enumerate(points)]


def test_error_at_bits_is_log_log_interpolated_between_logged_steps():
    history = _curve([(0, 100.0), (10, 10.0), (1000, 0.1)])
    assert dynamic.error_at_bits(history, 100) == pytest.approx(1.0)  # halfway in log-log
    assert dynamic.error_at_bits(history, 10) == pytest.approx(10.0)
    assert dynamic.error_at_bits(history, 5) is None  # before the first step
    assert dynamic.error_at_bits(history, 2000) is None  # past the end of the run


def test_bits_to_reach_interpolates_the_crossing_and_says_when_never():
    history = _curve([(0, 100.0), (10, 10.0), (1000, 0.1)])
    assert dynamic.bits_to_reach(history, 1e-2) == pytest.approx(100.0)  # error 1 = 1e-2 x 100
    assert dynamic.bits_to_reach(history, 0.5) == pytest.approx(
        10.0
    )  # already met at the first step
    assert dynamic.bits_to_reach(history, 1e-4) is None


def test_accuracy_reach_is_linear_between_evaluations():
    assert dynamic._reach([(1.0, 0.2), (3.0, 0.6)], 0.4) == pytest.approx(2.0)
    assert dynamic._reach([(1.0, 0.2), (3.0, 0.6)], 0.7) is None


def test_quick_dynamic_page(tmp_path):
    assert main(["dynamic", "--quick", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "dynamic.md").read_text()
    assert "does PowerGossip on a one-peer schedule need fewer bytes" in page
    assert "one_peer_exponential:4" in page and "directed_exponential:4" in page
    assert "FAILED" not in page
    rows = list(csv.DictReader(io.StringIO((tmp_path / "dynamic_consensus.csv").read_text())))
    assert {r["topology"] for r in rows} == {
        "ring:4",
        "one_peer_exponential:4",
        "matchings:4",
        "directed_exponential:4",
    }
    # exact gossip on the one-peer schedule averages exactly in log2(4) = 2 steps
    exact = next(
        r for r in rows if r["topology"] == "one_peer_exponential:4" and r["spec"] == "exact"
    )
    assert exact["stop"] == "reached" and int(exact["steps"]) == 2
    saved = json.loads((tmp_path / "dynamic.json").read_text())
    assert len(saved["training"]) == 7 and all("error" not in r for r in saved["training"])
    assert all(math.isfinite(r["acc_avg"]) for r in saved["training"])
    assert (tmp_path / "dynamic_error_vs_bits.png").stat().st_size > 0
    assert (tmp_path / "dynamic_accuracy.png").stat().st_size > 0
