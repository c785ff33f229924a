"""The non-IID gap: on a Dirichlet partition, PowerGossip's local models can trail exact gossip's
while the averaged model is close. A small grid of PowerGossip ranks and power iterations, each
row's local (mean, min over peers) and averaged-model accuracy, its bytes, and its gap to exact."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from experiments.pages._markdown import snippets
from experiments.suite.tables import _pct

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
        cells = dict(label=best["label"], gap=gaps(best, exact)["acc_local_mean"])
        cells.update(mb=best["mb_per_peer"], ratio=best["mb_per_peer"] / first["mb_per_peer"])
        cells.update(
            first=first["label"], saved=100 * (1 - best["mb_per_peer"] / exact["mb_per_peer"])
        )
        lines.append(SAY["close"].format(**cells, close=CLOSE_PP, exact_mb=exact["mb_per_peer"]))
    return lines
