"""Everything the bandwidth page shows, computed from its rows (`collect`): the JSON the page
writes, and what its text and plot are drawn from; and the checks beside the figures (the
complete cluster runs against the composition, the plateau run, the runs' time). Pure: rows in,
numbers out."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Dict, List, Mapping, Optional

from . import compose
from .compose import Schedule
from .recipe import BY_KEY, COMPARED, Setting, algorithms_on, best_value, chosen, gamma_on
from .recipe import main_key, measured_on, rate_name, timed_settings, timing_key, train_keys
from .recipe import tuning_keys
from .text import answer


def _ok(row: Optional[Mapping]) -> bool:
    return row is not None and "error" not in row and "skipped" not in row


#: What a tuning grid's values are, by `Algorithm.tune`.
TUNED = {"lr": "lr", "gamma": "γ", "gamma_x": "γ ÷ topology γ"}


def tuning(s: Setting, data: Mapping[str, Dict]) -> List[Dict[str, Any]]:
    """Each algorithm's grid: the values, their final accuracies, and the one chosen."""
    out = []
    for a in (BY_KEY[key] for key in s.algorithms):
        best = best_value(s, a, data)
        rows = [(v, data.get(k, {})) for v, k in tuning_keys(s, a)]
        values = [
            {"value": v, "acc_avg": r.get("acc_avg"), "error": r.get("error")} for v, r in rows
        ]
        chosen = None if best is None else best[0]
        out.append(
            dict(algorithm=a.key, label=a.label, tuned=TUNED[a.tune], values=values, chosen=chosen)
        )
    return out


def accuracy(s: Setting, data: Mapping[str, Dict], target: Optional[float]) -> Dict[str, Any]:
    """Per topology and algorithm: the seeds' final accuracies, curves, bytes, steps to target."""
    out: Dict[str, Any] = {}
    for topology in s.topologies:
        out[topology] = {}
        for key in algorithms_on(s, topology):
            keys = train_keys(s, key, topology, data)
            rows = [data[k] for k in keys]
            pick = chosen(s, key, data)
            entry: Dict[str, Any] = {"keys": keys, "label": BY_KEY[key].label}
            if pick is not None:
                entry["lr"] = pick[0]
                gamma = gamma_on(BY_KEY[key], pick[1], topology)
                # 10 digits: a topology's γ comes from eigenvalues, whose last bits differ
                # across numpy builds, and the JSON must not
                entry["gamma"] = None if gamma is None else float(f"{gamma:.10g}")
            good = [r for r in rows if _ok(r)]
            entry["errors"] = [r["error"] for r in rows if "error" in r]
            if good:
                entry.update(_curves(good, target))
            out[topology][key] = entry
    return out


def _curves(rows: List[Dict], target: Optional[float]) -> Dict[str, Any]:
    finals = [r["acc_avg"] for r in rows]
    hits = [compose.first_reach(r["evals"], target) if target else None for r in rows]
    return {
        "seeds": len(rows),
        "finals": finals,
        "final_mean": statistics.fmean(finals),
        "final_std": statistics.stdev(finals) if len(finals) > 1 else None,
        "peaks": [max(e[1] for e in r["evals"]) for r in rows],
        "steps": rows[0]["steps"],
        "steps_per_epoch": rows[0]["steps_per_epoch"],
        "parameters": rows[0]["parameters"],
        "mb_total": statistics.fmean(r["mb_per_peer"] for r in rows),
        "metric_mb_total": statistics.fmean(r["metric_mb_per_peer"] for r in rows),
        "evaluations": len(rows[0]["evals"]),
        "steps_to_target": [None if h is None else h[0] for h in hits],
        "mb_to_target": [None if h is None else h[1] for h in hits],
        "curves": [r["evals"] for r in rows],
        "mean_curve": compose.mean_curve([r["evals"] for r in rows]),
    }


def target_of(s: Setting, acc: Mapping[str, Any]) -> Optional[float]:
    """The common target: the highest whole percent every run of the compared algorithms (every
    topology, every seed) reaches."""
    peaks = []
    for topology in s.topologies:
        for key in COMPARED:
            entry = acc.get(topology, {}).get(key)
            if key not in s.algorithms:
                continue
            if entry is None or "peaks" not in entry:
                return None
            peaks += entry["peaks"]
    return compose.common_target(peaks) if peaks else None


def costs(s: Setting, data: Mapping[str, Dict]) -> Dict[str, Any]:
    """Per topology and rate (and the slow-host settings): every algorithm's `StepCosts`, the
    evaluation's `EvalCosts`, and the rows' load and host facts. An all-reduce's step and the
    evaluation (their rings go through all hosts whatever the topology) come from the tuning
    topology's rows (`recipe.measured_on`)."""
    out: Dict[str, Any] = {}
    for topology, rate, slow in timed_settings(s):
        row = data.get(timing_key(topology, rate, slow))
        if not _ok(row):
            continue
        per, borrowed = {}, {}
        for key in s.algorithms:
            source = measured_on(s, key, topology)
            timed = row if source == topology else data.get(timing_key(source, rate, slow))
            alone = data.get(f"alone/{source}/{key}")
            if _ok(timed) and key in timed["algorithms"] and _ok(alone):
                entry = compose.step_costs(timed["algorithms"][key], alone, rate)
                per[key] = dataclasses.asdict(entry)
                if source != topology:
                    borrowed[key] = source
        home = row if "eval" in row else data.get(timing_key(s.tune_topology, rate, slow))
        alone = data.get(f"alone/{s.tune_topology}/{s.algorithms[0]}")
        evaluation = None
        if _ok(home) and "eval" in home and _ok(alone):
            evaluation = dataclasses.asdict(compose.eval_costs(home, alone))
        out.setdefault(topology, {})[rate_name(rate, slow)] = {
            "steps": per,
            "borrowed": borrowed,
            "eval": evaluation,
            "load": [row["load_before"], row["load_after"]],
            "periods": {k: v["periods"] for k, v in row["algorithms"].items()},
            "spread": {
                k: [min(v["wall_min"]), max(v["wall_max"])] for k, v in row["algorithms"].items()
            },
            "link_bits": row.get("link", {}).get("payload_bits"),
            "link_error": row.get("link", {}).get("error"),
            "retransmitted": {phase: _share(row, phase) for phase in ("training", "replay")},
        }
    return out


def _share(row: Mapping, phase: str) -> Optional[Dict[str, float]]:
    """The share of TCP segments the hosts retransmitted in `phase`, and their retransmission
    timeouts, all algorithms together."""
    sent = retransmitted = timeouts = 0
    for entry in row["algorithms"].values():
        counts = entry.get("tcp", {}).get(phase)
        if counts:
            sent += counts["OutSegs"]
            retransmitted += counts["RetransSegs"]
            timeouts += counts["TCPTimeouts"]
    return {"share": retransmitted / sent, "timeouts": timeouts} if sent else None


def schedule(s: Setting, steps: Mapping[str, Dict], ev: Optional[Dict], key: str, figure: str):
    """The `Schedule` of algorithm `key` under `figure` (measured, core_each, projected), or None
    when a part is missing. Evaluations cost the same figure (projected: the core-each one)."""
    a = BY_KEY[key]
    if key not in steps:
        return None
    warm_steps, warm = 0, 0.0
    if a.warmup is not None:
        if a.warmup[1] not in steps:
            return None
        warm_steps, warm = a.warmup[0], steps[a.warmup[1]][figure]
    per_eval = 0.0 if ev is None else ev["measured" if figure == "measured" else "core_each"]
    return Schedule(steps[key][figure], warm_steps, warm, per_eval)


FIGURES = ("core_each", "measured", "projected")


def times(s: Setting, acc: Mapping, cost: Mapping, target: Optional[float]) -> Dict[str, Any]:
    """Seconds to the target per topology, rate (and slow-host setting) and algorithm: each
    figure, training only and with the run's evaluations, per seed and their mean/min/max."""
    out: Dict[str, Any] = {}
    if target is None:
        return out
    for topology, by_rate in cost.items():
        for name, c in by_rate.items():
            for key in s.algorithms:
                entry = acc[topology].get(key, {})
                if "curves" not in entry:
                    continue
                cell = {}
                for figure in FIGURES:
                    plan = schedule(s, c["steps"], c["eval"], key, figure)
                    if plan is None:
                        continue
                    train_only = dataclasses.replace(plan, per_eval=0.0)
                    cell[figure] = _seeds(
                        compose.per_seed_times(entry["curves"], target, train_only)
                    )
                    if c["eval"] is None:  # not timed at this rate: no figure with evaluations
                        continue
                    cell[figure + "_with_evals"] = _seeds(
                        compose.per_seed_times(entry["curves"], target, plan)
                    )
                out.setdefault(topology, {}).setdefault(name, {})[key] = cell
    return out


def _seeds(values: List[Optional[float]]) -> Dict[str, Any]:
    """Per-seed seconds and their mean (None when a seed never reaches the target), min, max."""
    reached = [v for v in values if v is not None]
    mean = statistics.fmean(values) if values and len(reached) == len(values) else None
    low, high = (min(reached), max(reached)) if reached else (None, None)
    return {"per_seed": values, "mean": mean, "min": low, "max": high}


def slow_host(s: Setting, cost: Mapping) -> Dict[str, Any]:
    """Per topology and algorithm: the step with one host's link slowed against all at the base
    rate (measured and core each) and the ratio."""
    out: Dict[str, Any] = {}
    if s.slow is None:
        return out
    base, host, rate = s.slow
    for topology in s.slow_topologies:
        normal = cost.get(topology, {}).get(base)
        slowed = cost.get(topology, {}).get(rate_name(base, (host, rate)))
        if normal is None or slowed is None:
            continue
        for key in s.algorithms:
            a, b = normal["steps"].get(key), slowed["steps"].get(key)
            if a is None or b is None:
                continue
            out.setdefault(topology, {})[key] = {
                "measured": [a["measured"], b["measured"]],
                "core_each": [a["core_each"], b["core_each"]],
                "comm_replayed": [a["comm_replayed"], b["comm_replayed"]],
            }
    return out


def e2e(s: Setting, data: Mapping[str, Dict], cost: Mapping) -> List[Dict[str, Any]]:
    """The complete cluster runs against the composition and the in-process models."""
    out = []
    for topology, key, rate in s.e2e:
        row = data.get(f"e2e/{topology}/{key}/{rate}")
        source = main_key(s, key, topology, 0, data)
        if row is None or source is None:
            continue
        entry = {"algorithm": key, "topology": topology, "rate": rate}
        if "skipped" in row:
            out.append(dict(entry, skipped=row["skipped"]))
            continue
        c = cost.get(topology, {}).get(rate)
        plan = None if c is None else schedule(s, c["steps"], c["eval"], key, "measured")
        evals, summary = row["evals"], row["summary"]
        wall, composed, points = summary["wall_time_s"], None, []
        if plan is not None:
            composed = plan.until(summary["steps"], len(evals))
            points = [plan.until(step, i + 1) / at - 1 for i, (step, at, _) in enumerate(evals)]
        entry.update(source=source, measured_wall=wall, composed_wall=composed)
        entry["gap"] = None if composed is None else composed / wall - 1
        entry["largest_gap_at_evaluations"] = max(points, key=abs) if points else None
        entry.update(steps=summary["steps"], evaluations=len(evals))
        entry["same_models"] = row["model_sha256"] == data[source].get("model_sha256")
        entry.update(peers=len(row["model_sha256"]), acc_avg=row["acc_avg"])
        entry.update(load=[row["load_before"], row["load_after"]])
        out.append(dict(entry, launch_seconds=row["launch_seconds"]))
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
