"""experiments/results/consensus.md: the report page, rendered from the records of
`driver.run_experiment` (or `report.load_record`), never from another page's text."""

from __future__ import annotations

import datetime
import math
import os
import platform
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from gossip_powersgd.utils import atomic_write, git_commit

from .measure import DIVERGE_FACTOR, problem_shapes
from .report import REPORT_PATH, ROOT, _family, budget_name, fmt_err, fmt_gamma, format_table


def _headline(record: Dict) -> List[str]:
    """Data-driven comparison lines at each budget: the best PowerGossip against exact gossip, the
    best tuned baseline, and the best baseline whose compressor has PowerGossip's float count
    (top-k, low rank)."""
    lines = []
    summary = record["summary"]
    error0 = record["results"][0]["history"][0]["error"]
    families = {label: _family(entry) for label, entry in summary.items()}

    def ratio(e_pg: float, e_other: float) -> str:
        if max(e_pg, e_other) < 1e-9 * error0:
            return "both at the float32 rounding floor"
        return (f"PowerGossip's error is {e_other / e_pg:.3g}× lower" if e_pg < e_other
                else f"PowerGossip's error is {e_pg / e_other:.3g}× higher")

    def is_powergossip(family):
        return family[0] == "powergossip"

    def is_exact(family):
        return family[0] == "exact"

    def is_tuned(family):
        return family[1] == "tuned"

    def is_matched_size(family):  # compressors sending as many floats as PowerGossip rank 1
        return family[1] == "tuned" and family[2] in ("topk", "lowrank")

    for budget in record["budgets"]:
        def best(pick):
            cells = [(label, e["budgets"][budget]) for label, e in summary.items()
                     if pick(families[label]) and e["budgets"][budget]["status"] == "ok"]
            return min(cells, key=lambda c: c[1]["row"]["error"]) if cells else None

        pg = best(is_powergossip)
        if pg is None:
            continue
        e_pg = pg[1]["row"]["error"]
        parts = [f"best PowerGossip ({pg[0]}) {fmt_err(e_pg)}"]
        verdicts = []
        exact = best(is_exact)
        if exact is not None:
            parts.append(f"exact gossip {fmt_err(exact[1]['row']['error'])}")
            verdicts.append(f"vs exact gossip: {ratio(e_pg, exact[1]['row']['error'])}")
        for name, found in (("best tuned baseline", best(is_tuned)),
                            ("best top-k / low-rank baseline", best(is_matched_size))):
            if found is not None:
                parts.append(f"{name} ({found[0]}, γ={fmt_gamma(found[1]['gamma'])}) "
                             f"{fmt_err(found[1]['row']['error'])}")
                verdicts.append(f"vs {name}: {ratio(e_pg, found[1]['row']['error'])}")
        lines.append(f"- ≤ {budget_name(budget)} bits per peer: " + " · ".join(parts) + ". "
                     + "; ".join(verdicts) + ".")
    return lines


def _edge_notes(record: Dict) -> List[str]:
    """Swept algorithms whose best gamma at the largest budget is an end of the grid."""
    grid = record["gammas"]
    lines = []
    for label, entry in record["summary"].items():
        cell = entry["budgets"][record["budgets"][-1]]
        if entry["swept"] and cell["status"] == "ok" and cell["gamma"] in (min(grid), max(grid)):
            side = "largest" if cell["gamma"] == max(grid) else "smallest"
            lines.append(f"- {label}: the best γ at ≤ {budget_name(record['budgets'][-1])} bits is the "
                         f"grid's {side} value ({fmt_gamma(cell['gamma'])}); a γ beyond the grid might do better.")
    return lines
def write_report(records: Sequence[Dict], command: str, seconds: float, path: Path = REPORT_PATH,
                 date: Optional[str] = None, note: str = "") -> Path:
    """experiments/results/consensus.md from the records of `run_experiment` (or `load_record`)."""
    backends = sorted({r["backend"] for r in records})
    lines = [
        "# Consensus experiment (PowerGossip paper §5)",
        "",
        f"Command: `{command}`{note}  ",
        f"Date: {date or datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} · commit {git_commit(ROOT)} · "
        f"backend: {', '.join(backends)} ({'LocalCluster, one thread per peer' if backends == ['local'] else 'MPI'}), "
        f"torch threads 1 · running time {seconds / 60:.1f} min on {os.cpu_count()} shared cores "
        f"({platform.machine()})",
        "",
        "Every peer holds N(0,1) float32 tensors seeded 42 + rank and only gossips. Error = mean over "
        "peers of ‖x_i − x̄‖²_F (`consensus_distance`, float64). Bits per peer = 8 × the transport's "
        "`comm.stats.bytes_sent` (top-k's int32 indices and sign's scale included). Mixing weights "
        "W = uniform (1/(degree+1)). Exact gossip and PowerGossip use the topology's γ "
        "(2/(λmin+λmax) of I−W), untuned. Choco and DeepSqueeze are swept over "
        f"γ ∈ {{{', '.join(fmt_gamma(g) for g in records[0]['gammas'])}}}"
        + (f" in two stages to keep the running time modest: every γ runs until it has sent "
           f"{budget_name(records[0]['screen_bits'])} bits per peer, then the {records[0]['finalists']} "
           f"best γ at that budget are rerun to {budget_name(records[0]['max_bits'])} bits. Each budget "
           f"column shows the best γ's error at that budget (γ given per cell): over the whole grid up "
           f"to {budget_name(records[0]['screen_bits'])} bits, over the finalists beyond. "
           if records[0].get("screen_bits") else
           " with full-length runs; each budget column shows the best γ's error at that budget (γ "
           "given per cell). ")
        + "A run stops after the first step that exceeds the largest budget, or as *diverged* once its "
        f"error exceeds {DIVERGE_FACTOR:g}× the initial error. A cell is the error of the last step "
        "whose cumulative bits per peer are ≤ the budget; \"—\" when the first step already exceeds "
        "it. The plots show each algorithm at the γ that is best at the largest budget.",
        "",
        "Top-k keeps k matched to PowerGossip rank 1's floats per message (measured from its traffic: "
        "the ratio is given per section); it also sends k int32 indices, so it costs twice the bits "
        "of PowerGossip rank 1 per step. `lowrank:1` is a rank-1 approximation by one power "
        "iteration from a fresh random start each round (not an exact SVD).",
        "",
    ]
    for record in records:
        rel = Path(record["out"]).resolve().relative_to(path.parent.resolve())
        steps_note = ", ".join(f"{r['label']}{' γ=' + fmt_gamma(r['gamma']) if r['swept'] else ''}: "
                               f"{r['steps']}" for r in record["results"] if not r["swept"])
        lines += [
            f"## {record['topology']}, {record['problem']} "
            f"({len(problem_shapes(record['problem']))} tensor(s), "
            f"{sum(math.prod(s) for s in problem_shapes(record['problem']))} floats per peer)",
            "",
            f"γ (topology) = {record['gamma_topology']:.4g}"
            + (f" · top-k ratio {record['topk_ratio']:g}" if record["topk_ratio"] else "")
            + f" · {len(record['results'])} runs in {record['seconds']:.0f} s · steps run: {steps_note}",
            "",
            format_table(record["summary"], record["budgets"], markdown=True),
            "",
            *_headline(record),
            *_edge_notes(record),
            "",
            f"![error vs bits]({rel.as_posix()}/error_vs_bits.png) "
            f"![error vs steps]({rel.as_posix()}/error_vs_steps.png)",
            "",
            f"Data: [`{rel.as_posix()}/table.csv`]({rel.as_posix()}/table.csv) (every γ at every budget), "
            f"`{rel.as_posix()}/runs/*.jsonl` (curves), `{rel.as_posix()}/summary.json`.",
            "",
        ]
    atomic_write(path, "\n".join(lines))
    return path


