"""Everything the bandwidth page shows, computed from its rows (`collect`): the JSON the page
writes, and what its text and plot are drawn from. Pure: rows in, numbers out."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Dict, List, Mapping, Optional

from . import compose
from .compose import Schedule
from .recipe import (
    BY_KEY,
    COMPARED,
    Setting,
    best_value,
    chosen,
    algorithms_on,
    gamma_on,
    measured_on,
    rates_on,
    train_keys,
    tuning_keys,
)


def _ok(row: Optional[Mapping]) -> bool:
    return row is not None and "error" not in row and "skipped" not in row


def tuning(s: Setting, data: Mapping[str, Dict]) -> List[Dict[str, Any]]:
    """Each algorithm's grid: the values, their final accuracies, and the one chosen."""
    out = []
    for key in s.algorithms:
        a = BY_KEY[key]
        best = best_value(s, a, data)
        label = {"lr": "lr", "gamma": "γ", "gamma_x": "γ ÷ topology γ"}[a.tune]
        values = []
        for value, row_key in tuning_keys(s, a):
            row = data.get(row_key, {})
            values.append(
                {"value": value, "acc_avg": row.get("acc_avg"), "error": row.get("error")}
            )
        out.append(
            {
                "algorithm": key,
                "label": a.label,
                "tuned": label,
                "values": values,
                "chosen": None if best is None else best[0],
            }
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


def timing_key(topology: str, rate: str, slow=None) -> str:
    return f"timing/{topology}/{rate}" + (f"+{slow[1]}@{slow[2]}" if slow else "")


def costs(s: Setting, data: Mapping[str, Dict]) -> Dict[str, Any]:
    """Per topology and rate (and the slow-host settings): every algorithm's `StepCosts`, the
    evaluation's `EvalCosts`, and the rows' load and host facts. An all-reduce's step and the
    evaluation (their rings go through all hosts whatever the topology) come from the tuning
    topology's rows (`recipe.measured_on`)."""
    out: Dict[str, Any] = {}
    settings = [(t, r, None) for t in s.topologies for r in rates_on(s, t)]
    settings += [(t, s.slow[0], s.slow) for t in s.slow_topologies] if s.slow else []
    for topology, rate, slow in settings:
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
        name = rate if slow is None else f"{rate}+{slow[1]}@{slow[2]}"
        out.setdefault(topology, {})[name] = {
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
    reached = [v for v in values if v is not None]
    mean = compose.mean_or_none(values)
    return {
        "per_seed": values,
        "mean": mean,
        "min": min(reached) if reached else None,
        "max": max(reached) if reached else None,
    }


def table_of(t: Mapping, topology: str, rates, figure: str, evals: bool = False):
    """{rate: {algorithm: mean seconds or None}} of one topology and figure."""
    suffix = "_with_evals" if evals else ""
    return {
        rate: {
            k: v.get(figure + suffix, {}).get("mean")
            for k, v in t.get(topology, {}).get(rate, {}).items()
        }
        for rate in rates
    }


def answer(
    s: Setting, t: Mapping, target: Optional[float], acc: Optional[Mapping] = None
) -> List[str]:
    """The answer in words, per topology, from the core-each figure (training only), with what
    the measured figure and the evaluations change."""
    if target is None or not t:
        return []
    lines = []
    pct = f"{100 * target:.0f} %"
    for topology in s.topologies:
        rates = [r for r in s.rates if r in t.get(topology, {})]
        if not rates:
            continue
        core = table_of(t, topology, rates, "core_each")
        line = f"**{topology}**, to {pct}, hosts with a core each (training time): "
        line += compose.compare_line("PowerGossip r1", "exact gossip", core, rates)
        line += " " + compose.compare_line(
            "PowerGossip r1", "all-reduce", core, rates, against="allreduce"
        )
        lines.append(line)
        finals = {k: acc_of(acc, topology, k) for k in ("pg-r1", "exact", "allreduce")}
        if all(v is not None for v in finals.values()):
            peak = max(acc[topology]["pg-r1"]["peaks"])
            line = (
                f"Final accuracy ({topology}, mean over seeds): PowerGossip r1 "
                f"{100 * finals['pg-r1']:.2f} %, exact gossip {100 * finals['exact']:.2f} %, "
                f"all-reduce {100 * finals['allreduce']:.2f} %"
            )
            if finals["pg-r1"] < min(finals["exact"], finals["allreduce"]):
                line += (
                    f": a target above PowerGossip r1's best evaluation ({100 * peak:.2f} %) it "
                    f"does not reach in {s.base['epochs']} epochs, at any rate"
                )
            lines.append(line + ".")
        fast = ", ".join(
            f"{compose.rate_text(r)}: {BY_KEY[compose.fastest(core[r])].label}"
            for r in rates
            if compose.fastest(core[r])
        )
        lines.append(f"Fastest to {pct} at each rate ({topology}, core each): {fast}.")
        for figure, evals, what in (
            (
                "measured",
                False,
                f"the step as measured here ({_hosts(topology)} hosts on this machine's cores)",
            ),
            ("core_each", True, "a core each, with an evaluation after every epoch"),
        ):
            other = table_of(t, topology, rates, figure, evals)
            compared = [r for r in rates if other[r].get("pg-r1") is not None]
            changed = [
                r
                for r in compared
                for against in ("exact", "allreduce")
                if _ahead(core[r], "pg-r1", against) != _ahead(other[r], "pg-r1", against)
            ]
            if not compared:
                continue
            missing = [compose.rate_text(r) for r in rates if r not in compared]
            verdict = (
                "the same verdicts"
                if not changed
                else "other verdicts at "
                + ", ".join(dict.fromkeys(compose.rate_text(r) for r in changed))
            )
            if missing:
                verdict += f" (not timed at {', '.join(missing)})"
            lines.append(f"With {what}: {verdict}.")
    return lines


def acc_of(acc: Optional[Mapping], topology: str, key: str) -> Optional[float]:
    """Algorithm `key`'s final accuracy on `topology`, mean over seeds (None if unknown)."""
    return (acc or {}).get(topology, {}).get(key, {}).get("final_mean")


def _hosts(topology: str) -> int:
    import topologies

    return topologies.parse(topology).size


def _ahead(row: Mapping[str, Optional[float]], who: str, against: str) -> Optional[bool]:
    mine, theirs = row.get(who), row.get(against)
    if mine is None:
        return False
    return theirs is None or mine < theirs


def slow_host(s: Setting, cost: Mapping) -> Dict[str, Any]:
    """Per topology and algorithm: the step with one host's link slowed against all at the base
    rate (measured and core each) and the ratio."""
    out: Dict[str, Any] = {}
    if s.slow is None:
        return out
    base, host, rate = s.slow
    for topology in s.slow_topologies:
        normal = cost.get(topology, {}).get(base)
        slowed = cost.get(topology, {}).get(f"{base}+{host}@{rate}")
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
