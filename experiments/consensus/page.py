"""experiments/results/consensus.md: the report page, rendered from the records of
`driver.run_experiment` (or `report.load_record`), never from another page's text."""

from __future__ import annotations

import datetime
import math
from collections import Counter
import os
import platform
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from gossip_powersgd.utils import atomic_write, git_commit

from .compare import REACH_TARGETS, columns, heat_map, target_name, winner_cell, winner_text  # noqa: F401 (names others import from here)
from .measure import DIVERGE_FACTOR, FLOOR_MARGIN, FLOOR_ULPS, problem_shapes  # noqa: F401 (names others import from here)
from .report import CURVES, ROOT, _family, budget_name, fmt_err, fmt_gamma, format_table


def _ratio_text(pg: Dict, other: Dict) -> str:
    """'PowerGossip's relative error is k× lower/higher' at matched bits, with bounds and floors."""
    e_pg, e_other = pg["row"]["relative"], other["row"]["relative"]
    if pg["row"]["at_floor"] and other["row"]["at_floor"]:
        return "both at the precision floor"
    if pg["row"]["bound"] and other["row"]["bound"]:
        return "both stopped earlier below the stopping error"
    lower = e_pg < e_other
    factor = e_other / e_pg if lower else e_pg / e_other
    # An upper bound on the smaller error makes the factor a lower bound, on the larger one undefined.
    bound_small = (pg if lower else other)["row"]["bound"]
    bound_large = (other if lower else pg)["row"]["bound"]
    prefix = "≥ " if bound_small else ("≤ " if bound_large else "")
    text = f"PowerGossip's error is {prefix}{factor:.3g}× {'lower' if lower else 'higher'}"
    floor = [
        name
        for name, cell in (("PowerGossip", pg), ("the other", other))
        if cell["row"]["at_floor"]
    ]
    return text + (f" ({' and '.join(floor)} at precision floor)" if floor else "")


def _headline(record: Dict) -> List[str]:
    """Comparison lines at each budget, at exactly the budget's bits (seed 0): the best PowerGossip
    against exact gossip, the best tuned baseline, and the best baseline whose compressor has
    PowerGossip's float count (top-k, low rank)."""
    lines = []
    summary = record["summary"]
    families = {label: _family(entry) for label, entry in summary.items()}
    picks = (
        ("exact gossip", lambda f: f[0] == "exact"),
        ("best tuned baseline", lambda f: f[1] == "tuned"),
        (
            "best top-k / low-rank baseline",
            lambda f: f[1] == "tuned" and f[2] in ("topk", "lowrank"),
        ),
    )
    for budget in record["budgets"]:

        def best(pick):
            cells = [
                (label, e["budgets"][budget])
                for label, e in summary.items()
                if pick(families[label]) and e["budgets"][budget]["status"] == "ok"
            ]
            return min(cells, key=lambda c: c[1]["row"]["relative"]) if cells else None

        pg = best(lambda f: f[0] == "powergossip")
        if pg is None:
            continue
        parts = [f"best PowerGossip ({pg[0]}) {fmt_err(pg[1]['row']['relative'])}"]
        verdicts = []
        for name, pick in picks:
            found = best(pick)
            if found is None:
                continue
            gamma = (
                f", γ={fmt_gamma(found[1]['gamma'])}"
                if "gamma" in found[1]
                and found[1]["gamma"] is not None
                and families[found[0]][1] == "tuned"
                else ""
            )
            label = "exact gossip" if name == "exact gossip" else f"{name} ({found[0]}{gamma})"
            parts.append(f"{label} {fmt_err(found[1]['row']['relative'])}")
            verdicts.append(f"vs {name}: {_ratio_text(pg[1], found[1])}")
        lines.append(
            f"- at {budget_name(budget)} bits per peer (relative errors): "
            + " · ".join(parts)
            + ". "
            + "; ".join(verdicts)
            + "."
        )
    return lines


def _edge_notes(record: Dict) -> List[str]:
    """Swept algorithms whose best γ at the largest budget (or to reach the smallest target) is
    an end of the grid."""
    grid = record["gammas"]
    lines = []
    for label, entry in record["summary"].items():
        if not entry["swept"]:
            continue
        cell = entry["budgets"][record["budgets"][-1]]
        if cell["status"] == "ok" and cell["gamma"] in (min(grid), max(grid)):
            side = "largest" if cell["gamma"] == max(grid) else "smallest"
            lines.append(
                f"- {label}: the best γ at {budget_name(record['budgets'][-1])} bits is the "
                f"grid's {side} value ({fmt_gamma(cell['gamma'])}): not interior, a γ beyond "
                "the grid might do better."
            )
    return lines


def _winner_map(records: Sequence[Dict], path: Path) -> List[str]:
    budgets = records[0]["budgets"]
    cols = columns(budgets)
    header = ["topology", "problem", "seeds"] + [
        f"@ {budget_name(key)} bits" if kind == "budget" else f"bits to {target_name(key)}"
        for kind, key in cols
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for record in records:
        cells = [winner_text(winner_cell(record, kind, key)) for kind, key in cols]
        lines.append(
            f"| {record['topology']} | {record['problem']} | {len(record.get('seeds', [0]))} | "
            + " | ".join(cells)
            + " |"
        )
    image = heat_map(records, budgets, path.parent / "consensus" / "winner_map.png")
    rel = image.resolve().relative_to(path.parent.resolve()).as_posix()
    return lines + ["", f"![PowerGossip ÷ best baseline]({rel})", ""]


def _commits(records: Sequence[Dict]) -> str:
    """The commit(s) whose code made the records' numbers (each instance records its own), and the
    page's own commit where that differs (a page re-rendered later from saved outputs)."""
    counts = Counter(r.get("commit", "unknown") for r in records)
    now = git_commit(ROOT)
    if len(counts) == 1:
        text = f"commit {next(iter(counts))}"
    else:
        text = "commits " + ", ".join(
            f"{c} ({n} instance{'s' * (n > 1)})" for c, n in counts.items()
        )
    return text + ("" if set(counts) == {now} else f" (page rendered at commit {now})")


def write_report(
    records: Sequence[Dict],
    command: str,
    seconds: float,
    path: Path,
    date: Optional[str] = None,
    note: str = "",
    intro: Sequence[str] = (),
) -> Path:
    """The report page at `path` (consensus.md; the instances' folders under path.parent /
    consensus) from the records of `run_experiment` (or `load_record`)."""
    from .page_text import method_lines

    backends = sorted({r["backend"] for r in records})
    lines = [
        "# Consensus experiment (PowerGossip paper §5)",
        "",
        f"Command: `{command}`{note}  ",
        f"Date: {date or datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} · {_commits(records)} · "
        f"backend: {', '.join(backends)} ({'LocalCluster, one thread per peer' if backends == ['local'] else 'MPI'}), "
        f"torch threads 1 · running time {seconds / 60:.1f} min on {os.cpu_count()} shared cores "
        f"({platform.machine()}) · {len(records)} instances",
        "",
        *intro,
        *method_lines(records),
        "## Winner map",
        "",
        "Per instance and column: the winner among exact gossip, PowerGossip r1 and r4, Choco sign and "
        "Choco top-k (matched), and its margin over the runner-up: runner-up ÷ winner of the mean over "
        "seeds of the relative error at exactly that many bits (budget columns) or of the bits per "
        "peer to reach that relative error (last two columns); in brackets the range of the per-seed "
        'margins, which seeds\' own winner differs, and "≥" when the winner stopped early below '
        "the stopping error (its value is an upper bound). Tuned baselines run at the γ that is "
        "best on seed 0 at the largest budget.",
        "",
        *_winner_map(records, path),
    ]
    for record in records:
        rel = Path(record["out"]).resolve().relative_to(path.parent.resolve())
        seed0 = [r for r in record["results"] if r.get("seed", 0) == 0]
        steps_note = ", ".join(
            f"{r['label']}: {r['steps']} ({r['stop']})" for r in seed0 if not r["swept"]
        )
        lines += [
            f"## {record['topology']}, {record['problem']} "
            f"({len(problem_shapes(record['problem']))} tensor(s), "
            f"{sum(math.prod(s) for s in problem_shapes(record['problem']))} floats per peer)",
            "",
            f"γ (topology) = {record['gamma_topology']:.4g} · dtype {record.get('dtype', 'float32')}"
            + (f" · top-k ratio {record['topk_ratio']:g}" if record["topk_ratio"] else "")
            + f" · seeds {', '.join(map(str, record.get('seeds', [0])))} · {len(record['results'])} runs in "
            f"{record['seconds']:.0f} s · seed 0 steps run (stop): {steps_note}",
            "",
            "Seed 0: relative error at exactly each budget; bits per peer to reach each relative error.",
            "",
            format_table(record["summary"], record["budgets"], markdown=True),
            "",
            *_headline(record),
            *_edge_notes(record),
            "",
            f"![error vs bits]({rel.as_posix()}/error_vs_bits.png) "
            f"![error vs steps]({rel.as_posix()}/error_vs_steps.png)",
            "",
            f"Data: [`{rel.as_posix()}/table.csv`]({rel.as_posix()}/table.csv) (every run and seed at "
            f"every budget, absolute and relative errors), `{rel.as_posix()}/{CURVES}` (every run's curve: "
            f"gzipped JSON lines, one per run; seeds after 0 named `seed<k>/...`), `{rel.as_posix()}/summary.json`.",
            "",
        ]
    atomic_write(path, "\n".join(lines))
    return path
