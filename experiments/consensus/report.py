"""The consensus experiment's outputs: run files, the budget table (text, markdown, CSV), plots,
the summary JSON that a record is rebuilt from, and the report page. Numbers come in as the records
`driver.run_experiment` builds; nothing here runs an algorithm."""

from __future__ import annotations

import csv
import datetime
import gzip
import io
import json
import math
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from gossip_powersgd.utils import atomic_write, atomic_write_figure, git_commit

from .compare import REACH_TARGETS, reach_cells, target_name
from .measure import cells_for, summarize

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
#: The committed report's data, one folder per (topology, problem), and its page: written only by
#: `--report --out experiments/results`, never by default.
DEFAULT_OUT = RESULTS / "consensus"
REPORT_PATH = RESULTS / "consensus.md"
#: Plain runs write here (git-ignored), so that they never overwrite the report's committed data.
SCRATCH_OUT = ROOT / "runs" / "consensus"
#: `--report` without --out: its page and data go here (git-ignored).
REPORT_OUT = ROOT / "runs" / "consensus-report"
#: One instance's run curves, packed: gzipped JSON lines, one per run (see `write_curves`).
CURVES = "curves.jsonl.gz"


# --------------------------------------------------------------------------------------------------
# names and numbers


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", text).strip("_")


def run_file(spec: str, seed: int = 0) -> str:
    """A run's name in its instance's CURVES file (seeds after the first as seed<k>/...)."""
    name = slug(spec.replace(":", "_").replace(",", "_")) + ".jsonl"
    return name if seed == 0 else f"seed{seed}/{name}"


def default_out(topology: str, problem: str, base: Path = SCRATCH_OUT) -> Path:
    """The output folder of one (topology, problem) under `base`, e.g. base/ring8_matrix."""
    return base / f"{slug(topology.replace(':', ''))}_{slug(problem.replace(':', ''))}"


def fmt_err(value: float) -> str:
    return f"{value:.3g}"


def fmt_gamma(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.4g}"


def budget_name(budget: float) -> str:
    exponent = math.log10(budget)
    return f"1e{int(exponent)}" if exponent == int(exponent) else f"{budget:g}"


def _family(entry: Dict) -> Tuple[str, str, str]:
    """(algorithm name, what its γ is without a value, compressor name) of a summary entry."""
    from gossip_powersgd.algorithms import gamma_kind
    from gossip_powersgd.algorithms.registry import split_spec

    spec = entry["runs"][0]["spec"]
    name, options = split_spec(spec)
    return name, gamma_kind(spec), options.get("compressor", "").split(":")[0]


# --------------------------------------------------------------------------------------------------
# tables


def cell_text(cell: Dict, swept: bool) -> str:
    """A budget cell: the relative error at matched bits (the absolute one when a cell has no
    relative error), "≤" when the run stopped earlier below it, "(floor)" at the precision floor."""
    if cell["status"] != "ok":
        return cell["status"]
    row = cell["row"]
    text = ("≤ " if row.get("bound") else "") + fmt_err(row.get("relative", row["error"]))
    if row.get("at_floor"):
        text += " (floor)"
    return f"{text} (γ={fmt_gamma(cell['gamma'])})" if swept else text


def best_reach(entry: Dict, target: float) -> Tuple[Optional[float], Optional[float]]:
    """(fewest bits to reach `target` over an algorithm's runs, the γ of that run)."""
    found = [
        (r["reach"][target], r["gamma"])
        for r in entry["runs"]
        if r.get("reach", {}).get(target) is not None
    ]
    return min(found) if found else (None, None)


def reach_text(entry: Dict, target: float) -> str:
    bits, gamma = best_reach(entry, target)
    if bits is None:
        return "not reached"
    return f"{bits:.3g} (γ={fmt_gamma(gamma)})" if entry["swept"] else f"{bits:.3g}"


def format_table(summary: Dict[str, Dict], budgets: Sequence[float], markdown: bool = False) -> str:
    """Relative error (error / initial error) at exactly each bit budget (per peer), and the bits
    per peer to reach each of REACH_TARGETS, one row per algorithm."""
    with_reach = any("reach" in r for entry in summary.values() for r in entry["runs"])
    header = ["algorithm", "γ"] + [f"@ {budget_name(b)} bits" for b in budgets]
    if with_reach:
        header += [f"bits to {target_name(t)}" for t in REACH_TARGETS]
    rows = []
    for label, entry in summary.items():
        gammas = {r["gamma"] for r in entry["runs"]}
        gamma = "swept (best per column)" if entry["swept"] else fmt_gamma(next(iter(gammas)))
        rows.append(
            [label, gamma]
            + [cell_text(entry["budgets"][b], entry["swept"]) for b in budgets]
            + ([reach_text(entry, t) for t in REACH_TARGETS] if with_reach else [])
        )
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(r[k])) for r in rows + [header]) for k in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def table_csv(
    results: Sequence[Dict],
    summary: Dict[str, Dict],
    budgets: Sequence[float],
    topology: str,
    problem: str,
) -> str:
    """Every run's cell at every budget (seed, absolute and relative error at exactly the budget,
    whether it is an upper bound or at the precision floor, bits to each REACH_TARGET); on seed 0
    the best γ per (algorithm, budget) is marked 1."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "topology",
            "problem",
            "seed",
            "dtype",
            "algorithm",
            "spec",
            "gamma",
            "budget_bits",
            "status",
            "error",
            "relative_error",
            "upper_bound",
            "at_precision_floor",
            "best",
        ]
        + [f"bits_to_{target_name(t)}" for t in REACH_TARGETS]
    )
    for result in results:
        seed = result.get("seed", 0)
        for budget in budgets:
            cell = result["budgets"][budget]
            best = summary[result["label"]]["budgets"][budget]
            is_best = seed == 0 and best.get("spec") == result["spec"]
            row = cell.get("row", {})
            reach = result.get("reach", {})
            writer.writerow(
                [
                    topology,
                    problem,
                    seed,
                    result.get("dtype", "float32"),
                    result["label"],
                    result["spec"],
                    result["gamma"],
                    f"{budget:g}",
                    cell["status"],
                    row.get("error", ""),
                    row.get("relative", ""),
                    int(bool(row.get("bound"))),
                    int(bool(row.get("at_floor"))),
                    int(is_best),
                ]
                + ["" if reach.get(t) is None else reach[t] for t in REACH_TARGETS]
            )
    return buffer.getvalue()


def curves_bytes(results: Sequence[Dict]) -> bytes:
    """Every run's curve as one gzipped JSON line: {"run": its name, "step": [...],
    "bits_per_peer": [...], "error": [...]}. JSON writes a float's shortest repr, which reads back
    as the same double, so a page rendered from the file is the page rendered from the run; the gzip
    header carries no time stamp, so the same runs give the same bytes."""
    text = "".join(
        json.dumps(
            {
                "run": r["file"],
                **{
                    key: [row[key] for row in r["history"]]
                    for key in ("step", "bits_per_peer", "error")
                },
            }
        )
        + "\n"
        for r in results
    )
    return gzip.compress(text.encode("utf-8"), mtime=0)


def read_curves(path: Path) -> Dict[str, List[Dict]]:
    """{run name: its rows [{"step", "bits_per_peer", "error"}, ...]} from a CURVES file."""
    curves = {}
    for line in gzip.decompress(Path(path).read_bytes()).decode("utf-8").splitlines():
        if line:
            item = json.loads(line)
            curves[item["run"]] = [
                {"step": s, "bits_per_peer": b, "error": e}
                for s, b, e in zip(item["step"], item["bits_per_peer"], item["error"])
            ]
    return curves


# --------------------------------------------------------------------------------------------------
# plots and files


def plot(
    summary: Dict[str, Dict],
    results: Sequence[Dict],
    out: Path,
    title: str,
    budgets: Sequence[float] = (),
) -> List[Path]:
    """error_vs_bits.png (log-log) and error_vs_steps.png (semilog-y), one line per algorithm:
    solid for those at the topology's γ, dashed for the tuned baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_spec = {r["spec"]: r for r in results if r.get("seed", 0) == 0}
    paths = []
    for name, xkey, xlabel, logx in (
        ("error_vs_bits.png", "bits_per_peer", "bits sent per peer", True),
        ("error_vs_steps.png", "step", "steps", False),
    ):
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for k, (label, entry) in enumerate(summary.items()):
            result = by_spec[entry["plot_spec"]]
            rows = [r for r in result["history"] if (r[xkey] > 0 or not logx) and r["error"] > 0]
            if not rows:
                continue
            error0 = result["history"][0]["error"]
            legend = label + (f" (γ={fmt_gamma(result['gamma'])})" if entry["swept"] else "")
            style = "-" if _family(entry)[1] == "topology" else "--"
            ax.plot(
                [r[xkey] for r in rows],
                [r["error"] / error0 for r in rows],
                style,
                label=legend,
                color=f"C{k % 10}",
                linewidth=1.4,
            )
        ax.set_yscale("log")
        if logx:
            ax.set_xscale("log")
            for budget in budgets:
                ax.axvline(budget, color="0.6", linestyle=":", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("relative error: mean_i ‖x_i − x̄‖² / its initial value")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
        path = out / name
        atomic_write_figure(path, fig)
        paths.append(path)
    return paths


def write_outputs(record: Dict, out: Path, plots: bool = True) -> None:
    """CURVES, table.csv, summary.json and (with `plots`) the PNGs of one record into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / CURVES, curves_bytes(record["results"]))
    atomic_write(
        out / "table.csv",
        table_csv(
            record["results"],
            record["summary"],
            record["budgets"],
            record["topology"],
            record["problem"],
        ),
    )
    record.setdefault("commit", git_commit(ROOT))  # the code that made these numbers
    light = {k: v for k, v in record.items() if k not in ("results", "summary", "table", "out")}
    light["finished"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    light["runs"] = [
        {
            k: r[k]
            for k in (
                "label",
                "spec",
                "gamma",
                "swept",
                "stage",
                "stop",
                "steps",
                "bits_per_peer",
                "seconds",
                "file",
                "seed",
                "dtype",
                "floor",
            )
        }
        for r in record["results"]
    ]
    light["best"] = {
        label: {
            f"{b:g}": {k: v for k, v in cell.items() if k != "status"} | {"status": cell["status"]}
            for b, cell in entry["budgets"].items()
        }
        for label, entry in record["summary"].items()
    }
    atomic_write(out / "summary.json", json.dumps(light, indent=1) + "\n")
    if plots:
        plot(
            record["summary"],
            record["results"],
            out,
            f"{record['topology']} (W={record['weights']}), {record['problem']}: consensus error",
            record["budgets"],
        )


def load_record(out: Path) -> Dict:
    """The record `run_experiment` returned, rebuilt from the files it wrote into `out`."""
    out = Path(out)
    saved = json.loads((out / "summary.json").read_text())
    budgets = tuple(float(b) for b in saved["budgets"])
    curves = read_curves(out / CURVES)
    results = []
    for run in saved["runs"]:
        rows = curves[run["file"]]
        results.append(
            {
                **run,
                "history": rows,
                "reach": reach_cells(rows),
                "budgets": cells_for(
                    rows, budgets, run["stop"], run.get("stage", "full"), run.get("floor")
                ),
            }
        )
    summary = summarize([r for r in results if r.get("seed", 0) == 0], budgets)
    if "finished" not in saved:
        mtime = (out / "summary.json").stat().st_mtime
        saved["finished"] = datetime.datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M")
    return {
        **saved,
        "budgets": list(budgets),
        "out": str(out),
        "results": results,
        "summary": summary,
        "table": format_table(summary, budgets),
    }
