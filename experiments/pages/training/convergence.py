"""Algorithms compared at equal bytes, from each run's evaluation history: the MB (and epoch) at
which a row first reaches a common target accuracy, and the accuracy each row had reached when it
had sent as many bytes as the cheapest row sent in the whole run. And the non-IID gap: on a
Dirichlet partition, PowerGossip's local models can trail exact gossip's while the averaged model is
close; a grid of PowerGossip ranks and power iterations, each row's gap to exact gossip."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.pages._markdown import snippets, table
from experiments.suite.tables import _pct

#: A fixed target next to the data-driven one (the worst converged row's final accuracy).
FIXED_TARGET = 0.85
#: A row "collapsed" when its final accuracy is below this fraction of its best evaluation's (it
#: trained, then fell apart): it does not set the common target and cannot be the cheapest.
COLLAPSE_FRACTION = 0.9


def _good(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in rows if "error" not in r and r.get("evals")]


def peak(row: Dict[str, Any]) -> Dict[str, float]:
    """The row's evaluation with the best averaged-model accuracy (the first such)."""
    return max((e for e in row["evals"] if e["acc_avg"] is not None), key=lambda e: e["acc_avg"])


def collapsed(row: Dict[str, Any]) -> bool:
    """Whether the row's final accuracy fell below `COLLAPSE_FRACTION` of its peak."""
    return row["acc_avg"] < COLLAPSE_FRACTION * peak(row)["acc_avg"]


def collapse_note(row: Dict[str, Any]) -> str:
    """ "collapsed: peak P % at epoch E" for a collapsed row, else ""."""
    if not collapsed(row):
        return ""
    best = peak(row)
    return f"collapsed: peak {_pct(best['acc_avg'])} at epoch {best['epoch']:g}"


def first_reach(evals: Sequence[Dict[str, float]], target: float) -> Optional[Dict[str, float]]:
    """The first evaluation whose averaged-model accuracy is at least `target` (None: never)."""
    for record in evals:
        if record["acc_avg"] is not None and record["acc_avg"] >= target - 1e-12:
            return record
    return None


def accuracy_at_mb(evals: Sequence[Dict[str, float]], budget_mb: float) -> Optional[float]:
    """The averaged-model accuracy of the last evaluation made within `budget_mb` MB sent per peer
    (None: the first evaluation already cost more). No interpolation: a row is never credited with
    an accuracy it had not measured by then."""
    within = [e for e in evals if e["mb"] <= budget_mb * (1 + 1e-9) and e["acc_avg"] is not None]
    return within[-1]["acc_avg"] if within else None


def common_target(rows: Sequence[Dict[str, Any]]) -> Optional[float]:
    """The worst converged (not collapsed) row's final averaged-model accuracy, floored to 0.1 pp:
    every converged row reaches it. If every row collapsed, the worst of all."""
    good = [r for r in _good(rows) if r.get("acc_avg") is not None]
    finals = [r["acc_avg"] for r in good if not collapsed(r)] or [r["acc_avg"] for r in good]
    if not finals:
        return None
    return math.floor(1000 * min(finals) + 1e-9) / 1000


def common_budget(rows: Sequence[Dict[str, Any]]) -> Optional[float]:
    """The smallest total MB per peer of any row: every row has a measurement within it, or it is
    the row that sent the least."""
    totals = [r["evals"][-1]["mb"] for r in _good(rows) if r["evals"][-1]["mb"] > 0]
    return min(totals) if totals else None


def reach_cell(record: Optional[Dict[str, float]]) -> str:
    """ "MB (epoch E)" of a reach, or "not reached"."""
    if record is None:
        return "not reached"
    return f"{record['mb']:.3g} MB (epoch {record['epoch']:g})"


def equal_bytes_table(
    rows: Sequence[Dict[str, Any]],
) -> Tuple[str, Optional[float], Optional[float]]:
    """The markdown table comparing `rows` (one setting) at equal bytes: per row its final
    accuracy, where it first reaches each target and its accuracy at the common byte budget; with
    its data-driven target and byte budget."""
    target, budget = common_target(rows), common_budget(rows)
    targets: List[float] = [t for t in (target, FIXED_TARGET) if t is not None]
    if target is not None and abs(target - FIXED_TARGET) < 1e-9:
        targets = [target]
    head = ["algorithm", "seeds", "final averaged-model acc", "total MB / peer"]
    head += [f"first reaches {_pct(t)} at" for t in targets]
    head += [f"acc after {budget:.3g} MB / peer"] if budget is not None else []
    lines = []
    for r in _good(rows):
        note = collapse_note(r)
        final = _pct(r["acc_avg"]) + (f" ({note})" if note else "")
        cells = [r["label"], str(r.get("seeds", 1)), final, f"{r['evals'][-1]['mb']:.3g}"]
        cells += [reach_cell(first_reach(r["evals"], t)) for t in targets]
        if budget is not None:
            cells.append(_pct(accuracy_at_mb(r["evals"], budget)))
        lines.append(cells)
    return "\n".join(table(head, lines, None)) + "\n", target, budget


def cheapest_to_reach(rows: Sequence[Dict[str, Any]], target: float) -> Optional[Dict[str, Any]]:
    """The converged row that first reaches `target` with the fewest MB sent per peer (None: no row
    does)."""
    reached = [(first_reach(r["evals"], target), r) for r in _good(rows) if not collapsed(r)]
    reached = [(rec, r) for rec, r in reached if rec is not None]
    if not reached:
        return None
    rec, row = min(reached, key=lambda x: x[0]["mb"])
    return dict(row, reach=rec)


#: (label, spec) of the grid; the rank-1 and rank-4 single-iteration rows are the main table's runs.
NONIID_ROWS = [
    ("PowerGossip r1 (1 iter)", "powergossip:rank=1,iters=1"),
    ("PowerGossip r1 (2 iters)", "powergossip:rank=1,iters=2"),
    ("PowerGossip r2 (1 iter)", "powergossip:rank=2,iters=1"),
    ("PowerGossip r2 (2 iters)", "powergossip:rank=2,iters=2"),
    ("PowerGossip r4 (1 iter)", "powergossip:rank=4,iters=1"),
    ("PowerGossip r4 (2 iters)", "powergossip:rank=4,iters=2"),
]
#: A setting "closes the gap" when its local-model mean is within this many pp of exact gossip's.
CLOSE_PP = 1.0
#: The gap table's header and the verdict's sentences (in sections.md).
SAY = snippets(__file__, "sections.md")


def gaps(row: Dict[str, Any], exact: Dict[str, Any]) -> Dict[str, float]:
    """Exact gossip's accuracy minus the row's, in pp (positive: the row trails exact)."""
    return {
        key: 100 * (exact[key] - row[key]) for key in ("acc_local_mean", "acc_local_min", "acc_avg")
    }


def gap_table(rows: Sequence[Dict[str, Any]], exact: Optional[Dict[str, Any]]) -> str:
    """setting | local mean | local min | averaged | MB/peer | gap to exact (local mean, averaged)."""
    lines = SAY["gap table"].split("\n")
    for r in ([exact] if exact else []) + list(rows):
        if "error" in r:
            lines.append(f"| {r['label']} | {r['error']} | | | | | |")
            continue
        g = gaps(r, exact) if exact else None
        gap_cells = f"{g['acc_local_mean']:+.2f} pp | {g['acc_avg']:+.2f} pp" if g else "n/a | n/a"
        accs = " | ".join(_pct(r[k]) for k in ("acc_local_mean", "acc_local_min", "acc_avg"))
        lines.append(f"| {r['label']} | {accs} | {r['mb_per_peer']:.3f} | {gap_cells} |")
    return "\n".join(lines) + "\n"


def closing_setting(
    rows: Sequence[Dict[str, Any]], exact: Dict[str, Any]
) -> Optional[Dict[str, Any]]:
    """The cheapest (fewest MB per peer) row whose local-model mean is within `CLOSE_PP` of exact's."""
    close = [r for r in rows if "error" not in r and gaps(r, exact)["acc_local_mean"] <= CLOSE_PP]
    return min(close, key=lambda r: r["mb_per_peer"]) if close else None


def gap_verdict(rows: Sequence[Dict[str, Any]], exact: Optional[Dict[str, Any]]) -> List[str]:
    """Sentences (in sections.md): the rank-1 gap, and which setting closes it at what cost."""
    good = [r for r in rows if "error" not in r]
    if not exact or "error" in exact or not good:
        return [SAY["no gap verdict"]]
    first, best = good[0], closing_setting(good, exact)
    lines = [SAY["gap"].format(label=first["label"], **gaps(first, exact))]
    if best is None:
        top = max(good, key=lambda r: r["acc_local_mean"])
        gap = gaps(top, exact)["acc_local_mean"]
        cells = dict(label=top["label"], gap=gap, mb=top["mb_per_peer"])
        lines.append(SAY["no close"].format(**cells, close=CLOSE_PP))
    else:
        mb, exact_mb = best["mb_per_peer"], exact["mb_per_peer"]
        cells = dict(label=best["label"], gap=gaps(best, exact)["acc_local_mean"], mb=mb)
        cells.update(ratio=mb / first["mb_per_peer"], first=first["label"], exact_mb=exact_mb)
        lines.append(SAY["close"].format(**cells, close=CLOSE_PP, saved=100 * (1 - mb / exact_mb)))
    return lines
