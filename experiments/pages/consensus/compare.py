"""Who wins at matched bits, per instance and column (a bit budget, or the bits to reach a relative
error): the winner, its margin over the runner-up and the seeds' spread; and the heat map."""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from experiments.pages._figures import png, pyplot

from .measure import REACH_TARGETS

POWERGOSSIP_LABELS = ("PowerGossip r1", "PowerGossip r4")


def budget_name(value: float) -> str:
    """A budget or a target error as the page names it: "1e6", "1e-2" for a power of ten."""
    exponent = math.log10(value)
    return f"1e{int(exponent)}" if exponent == int(exponent) else f"{value:g}"


def column_title(kind: str, key: float) -> str:
    """A table column's title: "@ 1e6 bits" (a budget) or "bits to 1e-2" (a relative error)."""
    return f"@ {budget_name(key)} bits" if kind == "budget" else f"bits to {budget_name(key)}"


def columns(budgets: Sequence[float]) -> List[Tuple[str, float]]:
    """The winner map's columns: ("budget", bits) then ("reach", relative error)."""
    return [("budget", float(b)) for b in budgets] + [("reach", t) for t in REACH_TARGETS]


def chosen_runs(instance: Dict) -> Dict[str, Dict[int, Dict]]:
    """Per label, per seed, the run the winner map uses: the one run of an untuned algorithm, and
    a tuned one at the γ that is best on seed 0 at the largest budget (the only γ later seeds run)."""
    chosen: Dict[str, Dict[int, Dict]] = {}
    for label, entry in instance["summary"].items():
        for result in instance["results"]:
            if result["label"] == label and (
                result["seed"] or result["spec"] == entry["plot_spec"]
            ):
                chosen.setdefault(label, {})[result["seed"]] = result
    return chosen


def _value(result: Dict, kind: str, key: float) -> Optional[Tuple[float, bool, bool]]:
    """(value, is an upper bound, at the precision floor) of one run in one column, or None."""
    if kind == "budget":
        cell = result["budgets"][key]
        if cell["status"] != "ok":
            return None
        return cell["row"]["relative"], cell["row"]["bound"], cell["row"]["at_floor"]
    bits = result["reach"].get(key)
    return None if bits is None else (bits, False, False)


def winner_cell(
    instance: Dict, kind: str, key: float, labels: Optional[Sequence[str]] = None
) -> Dict:
    """One column's winner (lower is better): {"winner", "runner_up", "mean" (per label), "margin"
    (runner-up's mean / winner's), "spread" (of the per-seed margins), "disagree" (seeds whose own
    winner differs), "bound", "at_floor", "seeds"}. Only labels with a value on every seed compete."""
    chosen = chosen_runs(instance)
    seeds = sorted({s for runs in chosen.values() for s in runs})
    values: Dict[str, Dict[int, Tuple[float, bool, bool]]] = {}
    for label, runs in chosen.items():
        if labels is not None and label not in labels:
            continue
        per_seed = {s: _value(runs[s], kind, key) for s in seeds if s in runs}
        if len(per_seed) == len(seeds) and all(v is not None for v in per_seed.values()):
            values[label] = per_seed
    if not values:
        return {"winner": None, "seeds": seeds}
    means = {label: statistics.fmean(v[0] for v in per.values()) for label, per in values.items()}
    ranked = sorted(means, key=means.get)
    winner = ranked[0]
    out = {
        "winner": winner,
        "mean": means,
        "seeds": seeds,
        "bound": any(v[1] for v in values[winner].values()),
        "at_floor": any(v[2] for v in values[winner].values()),
        "runner_up": None,
    }
    if len(ranked) > 1:
        runner = ranked[1]
        out["runner_up"] = runner
        out["margin"] = means[runner] / means[winner] if means[winner] > 0 else math.inf
        per_seed = [values[runner][s][0] / values[winner][s][0] for s in seeds]
        out["spread"] = (min(per_seed), max(per_seed))
        out["runner_bound"] = any(v[1] for v in values[runner].values())
        out["disagree"] = [s for s in seeds if min(values, key=lambda l: values[l][s][0]) != winner]
    return out


def short(label: str) -> str:
    return (
        label.replace("PowerGossip ", "PG ")
        .replace("exact gossip", "exact")
        .replace("Choco topk", "Choco top-k")
    )


def winner_text(cell: Dict) -> str:
    """One winner-map cell: 'PG r1 ×2.1 (1.8–2.4)', with notes for bounds, floors, disagreeing seeds."""
    if cell["winner"] is None:
        return "none reached"
    text = short(cell["winner"])
    if cell.get("runner_up") is None:
        return text + " (only one reached)"
    margin, (low, high) = cell["margin"], cell["spread"]
    sign = "≥ " if cell["bound"] and not cell.get("runner_bound") else ""
    text += f" {sign}×{margin:.3g}"
    if len(cell["seeds"]) > 1:
        text += f" ({low:.3g}–{high:.3g})"
    both = cell["bound"] and cell.get("runner_bound")
    notes = [f"{'both stopped early, ' if both else ''}vs {short(cell['runner_up'])}"]
    if cell["at_floor"]:
        notes.append("at precision floor")
    if cell.get("disagree"):
        notes.append(f"seed {', '.join(map(str, cell['disagree']))}: another winner")
    return text + " (" + "; ".join(notes) + ")"


def powergossip_ratio(instance: Dict, kind: str, key: float) -> Optional[float]:
    """Best PowerGossip's mean over seeds ÷ the best compressed baseline's (Choco sign / top-k):
    below 1, PowerGossip needs less (error, or bits)."""
    pg = winner_cell(instance, kind, key, POWERGOSSIP_LABELS)
    baselines = [
        label
        for label in instance["summary"]
        if label.startswith("Choco") and label.split()[1] in ("sign", "topk")
    ]
    base = winner_cell(instance, kind, key, baselines)
    if pg["winner"] is None or base["winner"] is None:
        return None
    return pg["mean"][pg["winner"]] / base["mean"][base["winner"]]


def heat_map(instances: Sequence[Dict], budgets: Sequence[float]) -> bytes:
    """A heat map of `powergossip_ratio` (log10), rows the instances, columns the winner map's."""
    plt = pyplot()
    import numpy as np

    cols = columns(budgets)
    grid = np.full((len(instances), len(cols)), np.nan)
    for i, instance in enumerate(instances):
        for j, (kind, key) in enumerate(cols):
            ratio = powergossip_ratio(instance, kind, key)
            if ratio is not None and ratio > 0:
                grid[i, j] = math.log10(ratio)
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(instances) + 1.8))
    limit = max(1.0, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0)
    image = ax.imshow(grid, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        text = "n/a" if np.isnan(value) else f"{10**value:.2g}"
        ax.text(j, i, text, ha="center", va="center", fontsize=6)
    ax.set_xticks(range(len(cols)))
    names = [
        f"err @ {b:.0e}" if kind == "budget" else f"bits to {budget_name(b)}" for kind, b in cols
    ]
    ax.set_xticklabels(names, fontsize=7)
    ax.set_yticks(range(len(instances)))
    ax.set_yticklabels([f"{r['topology']} {r['problem']}" for r in instances], fontsize=7)
    ax.set_title(
        "best PowerGossip ÷ best of Choco sign / top-k (mean over seeds; < 1: PowerGossip better)",
        fontsize=8,
    )
    fig.colorbar(image, ax=ax, label="log10 ratio")
    return png(fig, tight=True)
