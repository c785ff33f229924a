"""Everything the bandwidth page shows, computed from its rows (`collect`, pure; its JSON): steps to
the target, a step's cost three ways (measured, core each, projected: page.md defines them) and
the time to a step (`Schedule`)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.pages._markdown import mean_sd
from experiments.suite.runs import LATENCY_S
from gossip_powersgd.cluster import parse_rate as rate_bits
from gossip_powersgd.cluster.measure import PAYLOAD_SHARE

from .recipe import BY_KEY, COMPARED, Setting, algorithms_on, best_value, chosen, gamma_on
from .recipe import main_key, measured_on, rate_name, timed_settings, timing_key, train_keys
from .recipe import tuning_keys
from .text import answer


def first_reach(evals: Sequence[Sequence[float]], target: float) -> Optional[Tuple[int, float]]:
    """(step, training MB per peer) of the first evaluation ([step, accuracy, MB]) at `target`."""
    for step, accuracy, mb in evals:
        if accuracy >= target - 1e-12:
            return int(step), float(mb)
    return None


def evaluations_until(evals: Sequence[Sequence[float]], step: int) -> int:
    """How many evaluations were made up to and including step `step`."""
    return sum(1 for e in evals if e[0] <= step)


def common_target(peaks: Sequence[float]) -> float:
    """The highest whole percent every run reaches (`peaks`: each run's best accuracy)."""
    return math.floor(100 * min(peaks) + 1e-9) / 100


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> List[Tuple[int, float]]:
    """(step, mean accuracy over seeds) at every evaluation all `curves` share."""
    out = []
    for points in zip(*curves):
        steps = {int(p[0]) for p in points}
        if len(steps) != 1:
            raise ValueError(f"the seeds evaluated at different steps: {sorted(steps)}")
        out.append((steps.pop(), statistics.fmean(p[1] for p in points)))
    return out


def step_costs(timing: Mapping, alone: Mapping, rate: str) -> Dict[str, float]:
    """Seconds per step of one algorithm at `rate` (the projection's, for every host), from its
    timing row's entry (per-host lists) and its alone row: the three figures and their parts."""
    bits, median = rate_bits(rate), statistics.median
    rounds, replayed, fixed = max(timing["rounds"]), median(timing["replay"]), alone["cpu"]
    projected_comm = rounds * LATENCY_S + max(timing["critical_bytes"]) * 8 / bits
    return dict(
        measured=max(timing["wall_mean"]),
        core_each=fixed + replayed,
        projected=fixed + projected_comm,
        measured_median=max(timing["wall"]),
        cpu_alone=fixed,
        arith_alone=alone["arith"],
        compute_shared=median(timing["compute"]),
        arith_shared=median(timing["arith"]),
        cpu_shared=median(timing["cpu"]),
        comm_in_training=median(timing["comm"]),
        comm_replayed=replayed,
        comm_projected=projected_comm,
        comm_egress=max(timing["bytes_sent"]) * 8 / (bits * PAYLOAD_SHARE),
        bytes_sent=max(timing["bytes_sent"]),
        rounds=rounds,
    )


def eval_costs(timing: Mapping, alone: Mapping) -> Dict[str, Any]:
    """An evaluation: measured (slowest host), core each (alone, CPU, + replayed), its bytes."""
    e = timing["eval"]
    core_each = alone["eval_cpu"] + statistics.median(e["replay"])
    return dict(
        measured=max(e["seconds"]), core_each=core_each, metric_bytes=max(e["metric_bytes"])
    )


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A run's cost: `per_step` seconds a step (`warm_per_step` for the first `warm_steps`), and
    `per_eval` an evaluation."""

    per_step: float
    warm_steps: int = 0
    warm_per_step: float = 0.0
    per_eval: float = 0.0

    def training(self, steps: int) -> float:
        """Seconds of the first `steps` steps, evaluations left out."""
        warm = min(steps, self.warm_steps)
        return warm * self.warm_per_step + (steps - warm) * self.per_step

    def until(self, steps: int, evaluations: int) -> float:
        """Seconds of the first `steps` steps and `evaluations` evaluations."""
        return self.training(steps) + evaluations * self.per_eval


def per_seed_times(curves, target: float, schedule: Schedule) -> List[Optional[float]]:
    """Seconds to `target` per seed (to the first evaluation at it; None: never reached)."""
    hits = [(first_reach(evals, target), evals) for evals in curves]
    return [
        None if h is None else schedule.until(h[0], evaluations_until(e, h[0])) for h, e in hits
    ]


#: What a tuning grid's values are, by `Algorithm.tune`.
TUNED = {"lr": "lr", "gamma": "γ", "gamma_x": "γ ÷ topology γ"}
#: A step's figures (measured, core each, projected: page.md says what each is).
FIGURES = ("core_each", "measured", "projected")


def _ok(row: Optional[Mapping]) -> bool:
    return row is not None and "error" not in row and "skipped" not in row


def tuning(s: Setting, data: Mapping[str, Dict]) -> List[Dict[str, Any]]:
    """Each algorithm's grid: the values, their final accuracies, and the one chosen."""
    out = []
    for a in (BY_KEY[key] for key in s.algorithms):
        best = best_value(s, a, data)
        rows = [(v, data.get(k, {})) for v, k in tuning_keys(s, a)]
        values = [dict(value=v, acc_avg=r.get("acc_avg"), error=r.get("error")) for v, r in rows]
        entry = dict(algorithm=a.key, label=a.label, tuned=TUNED[a.tune], values=values)
        out.append(dict(entry, chosen=None if best is None else best[0]))
    return out


def accuracy(s: Setting, data: Mapping[str, Dict], target: Optional[float]) -> Dict[str, Any]:
    """Per topology and algorithm: the seeds' final accuracies, curves, bytes, steps to target."""
    out: Dict[str, Any] = {}
    for topology in s.topologies:
        out[topology] = {}
        for key in algorithms_on(s, topology):
            keys = train_keys(s, key, topology, data)
            rows, pick = [data[k] for k in keys], chosen(s, key, data)
            entry: Dict[str, Any] = {"keys": keys, "label": BY_KEY[key].label}
            if pick is not None:
                gamma = gamma_on(BY_KEY[key], pick[1], topology)
                # 10 digits: a topology's γ comes from eigenvalues, whose last bits differ
                # across numpy builds, and the JSON must not
                entry.update(lr=pick[0], gamma=None if gamma is None else float(f"{gamma:.10g}"))
            good = [r for r in rows if _ok(r)]
            entry["errors"] = [r["error"] for r in rows if "error" in r]
            out[topology][key] = dict(entry, **_curves(good, target)) if good else entry
    return out


def _curves(rows: List[Dict], target: Optional[float]) -> Dict[str, Any]:
    finals, first = [r["acc_avg"] for r in rows], rows[0]
    hits = [first_reach(r["evals"], target) if target else None for r in rows]
    final_mean, final_std = mean_sd(finals)
    return dict(
        seeds=len(rows),
        finals=finals,
        final_mean=final_mean,
        final_std=final_std,
        peaks=[max(e[1] for e in r["evals"]) for r in rows],
        **{k: first[k] for k in ("steps", "steps_per_epoch", "parameters")},
        mb_total=statistics.fmean(r["mb_per_peer"] for r in rows),
        metric_mb_total=statistics.fmean(r["metric_mb_per_peer"] for r in rows),
        evaluations=len(first["evals"]),
        steps_to_target=[None if h is None else h[0] for h in hits],
        mb_to_target=[None if h is None else h[1] for h in hits],
        curves=[r["evals"] for r in rows],
        mean_curve=mean_curve([r["evals"] for r in rows]),
    )


def target_of(s: Setting, acc: Mapping[str, Any]) -> Optional[float]:
    """The highest whole percent every run of the compared algorithms reaches (`common_target`)."""
    peaks = []
    for topology in s.topologies:
        for key in (k for k in COMPARED if k in s.algorithms):
            entry = acc.get(topology, {}).get(key)
            if entry is None or "peaks" not in entry:
                return None
            peaks += entry["peaks"]
    return common_target(peaks) if peaks else None


def costs(s: Setting, data: Mapping[str, Dict]) -> Dict[str, Any]:
    """Per topology and rate: each algorithm's `step_costs`, the `eval_costs` and the rows' facts
    (an all-reduce's step and the evaluation from the tuning topology's: `recipe.measured_on`)."""
    out: Dict[str, Any] = {}
    for topology, rate, slow in timed_settings(s):
        row = data.get(timing_key(topology, rate, slow))
        if not _ok(row):
            continue
        per, borrowed = {}, {}
        for key in s.algorithms:
            source = measured_on(s, key, topology)
            timed = data.get(timing_key(source, rate, slow))
            alone = data.get(f"alone/{source}/{key}")
            if _ok(timed) and key in timed["algorithms"] and _ok(alone):
                per[key] = step_costs(timed["algorithms"][key], alone, rate)
                if source != topology:
                    borrowed[key] = source
        home = row if "eval" in row else data.get(timing_key(s.tune_topology, rate, slow))
        alone = data.get(f"alone/{s.tune_topology}/{s.algorithms[0]}")
        ok = _ok(home) and "eval" in home and _ok(alone)
        evaluation = eval_costs(home, alone) if ok else None
        timed = row["algorithms"]
        out.setdefault(topology, {})[rate_name(rate, slow)] = {
            "steps": per,
            "borrowed": borrowed,
            "eval": evaluation,
            "load": [row["load_before"], row["load_after"]],
            "periods": {k: v["periods"] for k, v in timed.items()},
            "spread": {k: [min(v["wall_min"]), max(v["wall_max"])] for k, v in timed.items()},
            "link_bits": row.get("link", {}).get("payload_bits"),
            "link_error": row.get("link", {}).get("error"),
            "retransmitted": {phase: _share(row, phase) for phase in ("training", "replay")},
        }
    return out


def _share(row: Mapping, phase: str) -> Optional[Dict[str, float]]:
    """The share of TCP segments retransmitted in `phase`, and the timeouts (all algorithms)."""
    counts = [e.get("tcp", {}).get(phase) for e in row["algorithms"].values()]
    keys = ("OutSegs", "RetransSegs", "TCPTimeouts")
    sent, again, timeouts = (sum(c[k] for c in counts if c) for k in keys)
    return {"share": again / sent, "timeouts": timeouts} if sent else None


def schedule(steps: Mapping[str, Dict], ev: Optional[Dict], key: str, figure: str):
    """The `Schedule` of `key` under `figure` (evaluations: projected's is core each), or None."""
    warmup = BY_KEY[key].warmup
    if key not in steps or (warmup is not None and warmup[1] not in steps):
        return None
    warm_steps, warm = (0, 0.0) if warmup is None else (warmup[0], steps[warmup[1]][figure])
    per_eval = 0.0 if ev is None else ev["measured" if figure == "measured" else "core_each"]
    return Schedule(steps[key][figure], warm_steps, warm, per_eval)


def times(s: Setting, acc: Mapping, cost: Mapping, target: Optional[float]) -> Dict[str, Any]:
    """Seconds to the target per topology, rate, algorithm and figure, with and without evals."""
    out: Dict[str, Any] = {}
    for topology, by_rate in cost.items() if target is not None else ():
        for name, c in by_rate.items():
            for key in s.algorithms:
                curves = acc[topology].get(key, {}).get("curves")
                if curves is None:
                    continue
                cell = {}
                for figure in FIGURES:
                    plan = schedule(c["steps"], c["eval"], key, figure)
                    if plan is None:
                        continue
                    train_only = dataclasses.replace(plan, per_eval=0.0)
                    cell[figure] = _seeds(per_seed_times(curves, target, train_only))
                    if c["eval"] is not None:
                        cell[figure + "_with_evals"] = _seeds(per_seed_times(curves, target, plan))
                out.setdefault(topology, {}).setdefault(name, {})[key] = cell
    return out


def _seeds(values: List[Optional[float]]) -> Dict[str, Any]:
    """Per-seed seconds, their mean (None if a seed never reaches the target), min and max."""
    reached = [v for v in values if v is not None]
    mean = statistics.fmean(values) if values and len(reached) == len(values) else None
    low, high = (min(reached), max(reached)) if reached else (None, None)
    return {"per_seed": values, "mean": mean, "min": low, "max": high}


def slow_host(s: Setting, cost: Mapping) -> Dict[str, Any]:
    """Per topology and algorithm: [all at the base rate, one host slowed] of three figures."""
    out: Dict[str, Any] = {}
    base, host, rate = s.slow or (None, None, None)
    for topology in s.slow_topologies if s.slow else ():
        normal = cost.get(topology, {}).get(base)
        slowed = cost.get(topology, {}).get(rate_name(base, (host, rate)))
        for key in s.algorithms if normal and slowed else ():
            a, b = normal["steps"].get(key), slowed["steps"].get(key)
            if a is not None and b is not None:
                fields = ("measured", "core_each", "comm_replayed")
                out.setdefault(topology, {})[key] = {f: [a[f], b[f]] for f in fields}
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
        plan = None if c is None else schedule(c["steps"], c["eval"], key, "measured")
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
    """The plateau run against the chosen run it doubles: its epochs and accuracies."""
    key = next((k for k in data if k.startswith("plateau/")), None)
    if key is None:
        return None
    algorithm = key.split("/")[2]
    row, base = data[key], data.get(main_key(s, algorithm, s.tune_topology, 0, data), {})
    if not _ok(row) or not _ok(base):
        return None
    epochs = [r["steps"] // r["steps_per_epoch"] for r in (base, row)]
    return {"algorithm": algorithm, "epochs": epochs, "acc": [base["acc_avg"], row["acc_avg"]]}


def collect(s: Setting, data: Mapping[str, Dict]) -> Dict[str, Any]:
    """Everything the page shows; `run_seconds`: a training run's median wall time (no plateau)."""
    target = target_of(s, accuracy(s, data, None))
    acc, cost = accuracy(s, data, target), costs(s, data)
    t = times(s, acc, cost, target)
    trained = [r for k, r in data.items() if k.startswith(("tune/", "train/")) and _ok(r)]
    run_seconds = [r["run_seconds"] for r in trained if "run_seconds" in r]
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
        "run_seconds": statistics.median(run_seconds) if run_seconds else None,
    }
