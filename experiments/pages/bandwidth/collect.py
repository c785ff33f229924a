"""The checks beside the bandwidth page's figures (the complete cluster runs against the
composition, the plateau run, the runs' time) and `collect`, which gathers every number the page
shows from its rows. Pure: rows in, numbers out."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional

from .figures import (
    _ok,
    accuracy,
    answer,
    costs,
    schedule,
    slow_host,
    target_of,
    times,
    tuning,
)
from .recipe import Setting, main_key


def e2e(s: Setting, data: Mapping[str, Dict], cost: Mapping) -> List[Dict[str, Any]]:
    """The complete cluster runs against the composition and the in-process models."""
    out = []
    for topology, key, rate in s.e2e:
        row = data.get(f"e2e/{topology}/{key}/{rate}")
        source = main_key(s, key, topology, 0, data)
        if row is None or source is None:
            continue
        if "skipped" in row:
            out.append(
                {"algorithm": key, "topology": topology, "rate": rate, "skipped": row["skipped"]}
            )
            continue
        c = cost.get(topology, {}).get(rate)
        plan = None if c is None else schedule(s, c["steps"], c["eval"], key, "measured")
        evals = row["evals"]
        composed = None
        points = []
        if plan is not None:
            composed = plan.until(row["summary"]["steps"], len(evals))
            points = [plan.until(step, i + 1) / wall - 1 for i, (step, wall, _) in enumerate(evals)]
        out.append(
            {
                "algorithm": key,
                "topology": topology,
                "rate": rate,
                "source": source,
                "measured_wall": row["summary"]["wall_time_s"],
                "composed_wall": composed,
                "gap": None if composed is None else composed / row["summary"]["wall_time_s"] - 1,
                "largest_gap_at_evaluations": max(points, key=abs) if points else None,
                "steps": row["summary"]["steps"],
                "evaluations": len(evals),
                "same_models": row["model_sha256"] == data[source].get("model_sha256"),
                "peers": len(row["model_sha256"]),
                "acc_avg": row["acc_avg"],
                "load": [row["load_before"], row["load_after"]],
                "launch_seconds": row["launch_seconds"],
            }
        )
    return out


def plateau(s: Setting, data: Mapping[str, Dict]) -> Optional[Dict[str, Any]]:
    key = next((k for k in data if k.startswith("plateau/")), None)
    if key is None:
        return None
    algorithm = key.split("/")[2]
    source = main_key(s, algorithm, s.tune_topology, 0, data)
    row, base = data[key], data.get(source, {})
    if not _ok(row) or not _ok(base):
        return None
    return {
        "algorithm": algorithm,
        "epochs": [
            base["steps"] // base["steps_per_epoch"],
            row["steps"] // row["steps_per_epoch"],
        ],
        "acc": [base["acc_avg"], row["acc_avg"]],
    }


def run_seconds(data: Mapping[str, Dict]) -> Optional[float]:
    """The median wall time of an in-process training run of the full epochs (the plateau run,
    at twice the epochs, left out)."""
    found = [
        r["run_seconds"]
        for k, r in data.items()
        if k.startswith(("tune/", "train/")) and _ok(r) and "run_seconds" in r
    ]
    return statistics.median(found) if found else None


def collect(s: Setting, data: Mapping[str, Dict]) -> Dict[str, Any]:
    acc = accuracy(s, data, None)
    target = target_of(s, acc)
    acc = accuracy(s, data, target)
    cost = costs(s, data)
    t = times(s, acc, cost, target)
    return {
        "target": target,
        "tuning": tuning(s, data),
        "accuracy": acc,
        "costs": cost,
        "times": t,
        "slow_host": slow_host(s, cost),
        "e2e": e2e(s, data, cost),
        "plateau": plateau(s, data),
        "answer": answer(s, t, target, acc),
        "run_seconds": run_seconds(data),
    }
