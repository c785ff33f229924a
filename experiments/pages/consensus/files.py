"""The page's files beside consensus.md: who wins at matched bits, per instance and column (a bit
budget, or the bits to reach a relative error: the winner, its margin over the runner-up and the
seeds' spread) and the winner map's heat map; and one instance's files: its table (markdown,
table.csv), its run curves, its summary.json and its two plots."""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from experiments.pages._markdown import csv_text, table
from experiments.pages._figures import png, pyplot

from .measure import REACH_TARGETS

#: The labels of PowerGossip in the winner map's ratio (`powergossip_ratio`).
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
    summary, chosen = instance["summary"], {label: {} for label in instance["summary"]}
    for r in instance["results"]:
        if r["seed"] or r["spec"] == summary[r["label"]]["plot_spec"]:
            chosen[r["label"]][r["seed"]] = r
    return {label: runs for label, runs in chosen.items() if runs}


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
        x for x in instance["summary"] if x.split()[:2] in (["Choco", "sign"], ["Choco", "topk"])
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


#: One instance's run curves, packed: gzipped JSON lines, one per run (see `curves_bytes`).
CURVES = "curves.jsonl.gz"
#: summary.json's list of runs: these fields of each.
RUN_FIELDS = ("label", "spec", "gamma", "swept", "stage", "stop", "steps", "bits_per_peer")
RUN_FIELDS += ("seconds", "file", "seed", "dtype", "floor")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", text).strip("_")


def folder(topology: str, problem: str) -> str:
    """An instance's folder beside the page, e.g. consensus/ring8_matrix."""
    return f"consensus/{slug(topology.replace(':', ''))}_{slug(problem.replace(':', ''))}"


def run_file(spec: str, seed: int = 0) -> str:
    """A run's name in its instance's CURVES file (seeds after the first as seed<k>/...)."""
    name = slug(spec.replace(":", "_").replace(",", "_")) + ".jsonl"
    return name if seed == 0 else f"seed{seed}/{name}"


def fmt_gamma(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.4g}"


def family(entry: Dict) -> Tuple[str, str, str]:
    """(algorithm name, what its γ is without a value, compressor name) of a summary entry."""
    from gossip_powersgd.algorithms import gamma_kind
    from gossip_powersgd.algorithms.registry import split_spec

    spec = entry["runs"][0]["spec"]
    name, options = split_spec(spec)
    return name, gamma_kind(spec), options.get("compressor", "").split(":")[0]


def cell_text(cell: Dict, swept: bool) -> str:
    """A budget cell: the relative error at matched bits, "≤" when the run stopped earlier below
    it, "(floor)" at the precision floor, and the γ of a swept algorithm."""
    if cell["status"] != "ok":
        return cell["status"]
    row = cell["row"]
    text = ("≤ " if row["bound"] else "") + f"{row['relative']:.3g}"
    text += " (floor)" if row["at_floor"] else ""
    return f"{text} (γ={fmt_gamma(cell['gamma'])})" if swept else text


def reach_text(entry: Dict, target: float) -> str:
    """The fewest bits per peer to reach `target` over an algorithm's runs (with that run's γ)."""
    found = [
        (r["reach"][target], r["gamma"]) for r in entry["runs"] if r["reach"][target] is not None
    ]
    if not found:
        return "not reached"
    bits, gamma = min(found)
    return f"{bits:.3g} (γ={fmt_gamma(gamma)})" if entry["swept"] else f"{bits:.3g}"


def format_table(summary: Dict[str, Dict], budgets: Sequence[float]) -> str:
    """Markdown: relative error at exactly each bit budget (per peer), and the bits per peer to
    reach each of REACH_TARGETS, one row per algorithm (seed 0)."""
    header = ["algorithm", "γ"] + [column_title(*column) for column in columns(budgets)]
    rows = [
        [label, "swept (best per column)" if e["swept"] else fmt_gamma(e["runs"][0]["gamma"])]
        + [cell_text(e["budgets"][b], e["swept"]) for b in budgets]
        + [reach_text(e, t) for t in REACH_TARGETS]
        for label, e in summary.items()
    ]
    return "\n".join(table(header, rows, end=None))


#: table.csv's columns: the instance's, the run's, then the cell's at one budget (`table_csv`).
CSV_HEAD = "topology problem seed dtype algorithm spec gamma budget_bits status error "
CSV_HEAD += "relative_error upper_bound at_precision_floor best"


def table_csv(instance: Dict) -> str:
    """Every run's cell at every budget (seed, absolute and relative error at exactly the budget,
    upper bound or at the precision floor, bits to each target); on seed 0 the best γ per
    (algorithm, budget) is marked 1."""
    head = CSV_HEAD.split() + [f"bits_to_{budget_name(t)}" for t in REACH_TARGETS]
    return csv_text(
        head, (_csv_row(instance, r, b) for r in instance["results"] for b in instance["budgets"])
    )


def _csv_row(instance: Dict, r: Dict, budget: float) -> List:
    cell, row = r["budgets"][budget], r["budgets"][budget].get("row", {})
    best = (
        r["seed"] == 0
        and instance["summary"][r["label"]]["budgets"][budget].get("spec") == r["spec"]
    )
    return (
        [instance["topology"], instance["problem"]]
        + [r[k] for k in ("seed", "dtype", "label", "spec", "gamma")]
        + [f"{budget:g}", cell["status"], row.get("error", ""), row.get("relative", "")]
        + [int(bool(row.get("bound"))), int(bool(row.get("at_floor"))), int(best)]
        + ["" if r["reach"][t] is None else r["reach"][t] for t in REACH_TARGETS]
    )


def curves_bytes(instance: Dict) -> bytes:
    """Every run's curve as one gzipped JSON line {"run", "step", "bits_per_peer", "error"}; no
    time stamp in the gzip header, so the same runs give the same bytes."""
    lines = [json.dumps({"run": r["file"], **r["curve"]}) + "\n" for r in instance["results"]]
    return gzip.compress("".join(lines).encode("utf-8"), mtime=0)


def summary_json(instance: Dict) -> str:
    """summary.json: the instance's settings, every run's outcome, the best cell per budget."""
    skip = ("results", "summary", "folder")
    light = {k: v for k, v in instance.items() if k not in skip}
    light["runs"] = [{k: r[k] for k in RUN_FIELDS} for r in instance["results"]]
    light["best"] = {
        label: {
            f"{b:g}": {k: v for k, v in cell.items() if k != "status"} | {"status": cell["status"]}
            for b, cell in entry["budgets"].items()
        }
        for label, entry in instance["summary"].items()
    }
    return json.dumps(light, indent=1) + "\n"


def plots(instance: Dict) -> Dict[str, bytes]:
    """error_vs_bits.png (log-log) and error_vs_steps.png (semilog-y), seed 0, one line per
    algorithm (its best γ): solid at the topology's γ, dashed for the tuned baselines."""
    plt = pyplot()

    by_spec = {r["spec"]: r for r in instance["results"] if r["seed"] == 0}
    out = {}
    for name, xkey, xlabel, logx in (
        ("error_vs_bits.png", "bits_per_peer", "bits sent per peer", True),
        ("error_vs_steps.png", "step", "steps", False),
    ):
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for k, (label, entry) in enumerate(instance["summary"].items()):
            result = by_spec[entry["plot_spec"]]
            rows = [r for r in result["history"] if (r[xkey] > 0 or not logx) and r["error"] > 0]
            if not rows:
                continue
            error0 = result["history"][0]["error"]
            legend = label + (f" (γ={fmt_gamma(result['gamma'])})" if entry["swept"] else "")
            style = "-" if family(entry)[1] == "topology" else "--"
            x, y = [r[xkey] for r in rows], [r["error"] / error0 for r in rows]
            ax.plot(x, y, style, label=legend, color=f"C{k % 10}", linewidth=1.4)
        ax.set_yscale("log")
        if logx:
            ax.set_xscale("log")
            for budget in instance["budgets"]:
                ax.axvline(budget, color="0.6", linestyle=":", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("relative error: mean_i ‖x_i − x̄‖² / its initial value")
        title = f"{instance['topology']} (W={instance['weights']}), {instance['problem']}: consensus error"
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
        out[name] = png(fig, tight=True)
    return out
