"""One instance's files beside the page: its table (markdown, table.csv), its run curves, its
summary.json and its two plots."""

from __future__ import annotations

import gzip
import json
import re
from typing import Dict, List, Optional, Sequence, Tuple

from experiments.pages._markdown import csv_text, table
from experiments.pages._figures import png, pyplot

from .compare import budget_name, column_title, columns
from .measure import REACH_TARGETS

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


def fmt_err(value: float) -> str:
    return f"{value:.3g}"


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
    text = ("≤ " if row["bound"] else "") + fmt_err(row["relative"])
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
