"""Helpers of the training page's test files (tests/experiments/pages/training/test_*.py): synthetic
rows with known answers (no training)."""

from __future__ import annotations


def _evals(points, local=0.01):
    """(epoch, MB, averaged accuracy) -> eval dicts; local models `local` below the average."""
    return [
        {
            "epoch": e,
            "mb": mb,
            "acc_avg": a,
            "acc_local_mean": a - local,
            "acc_local_min": a - 2 * local,
        }
        for e, mb, a in points
    ]


def _row(label, points, spec=None, mb_per_step=None, **extra):
    evals = _evals(points)
    last = evals[-1]
    row = {
        "label": label,
        "spec": spec or label,
        "algorithm": spec or label,
        "topology": "ring:8",
        "partition": "iid",
        "model": "cnn1d",
        "epochs": last["epoch"],
        "parameters": 100,
        "acc_avg": last["acc_avg"],
        "acc_local_mean": last["acc_local_mean"],
        "acc_local_min": last["acc_local_min"],
        "mb_per_peer": last["mb"],
        "mb_per_step": mb_per_step if mb_per_step is not None else last["mb"] / 10,
        "evals": evals,
        "curve": [(e["mb"], e["acc_avg"]) for e in evals],
        "compute_s": 1.0,
        "rounds": 10,
        "critical_bytes": 1000,
        "run_seconds": 2.0,
    }
    row.update(extra)
    return row


EXACT = _row("exact gossip", [(2, 10.0, 0.50), (4, 20.0, 0.80), (6, 30.0, 0.90)], spec="exact")


CHEAP = _row(
    "PowerGossip r1 (1 iter)",
    [(2, 0.5, 0.45), (4, 1.0, 0.78), (6, 1.5, 0.88)],
    spec="powergossip:rank=1,iters=1",
)
