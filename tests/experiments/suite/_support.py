"""Helpers of the suite's test files (tests/experiments/suite/): measured rows of two algorithms on
synthetic numbers."""

from __future__ import annotations

from experiments.pages.training import design
from experiments.suite import runs


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
