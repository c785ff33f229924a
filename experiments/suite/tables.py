"""The suite's tables: markdown rows and CSV from the rows' data, and the pages' header line."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence

from experiments.pages._markdown import csv_text, snippets

from .runs import BANDWIDTHS, projected_seconds


def _pct(value: Optional[float], std: Optional[float] = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.2f}" + ("" if std is None else f" ± {100 * std:.2f}") + " %"


def _algorithm_name(row: Dict[str, Any]) -> str:
    from gossip_powersgd.algorithms.registry import split_spec

    return split_spec(str(row.get("algorithm", "")))[0]


def exact_reference(
    rows: Sequence[Dict[str, Any]], topology: str, partition: str, kind: str = "main"
) -> Optional[Dict]:
    """Exact gossip's row of the same setting (and the same group: main, headline or wide)."""
    setting = (topology, partition, kind)
    for r in rows:
        if (r["topology"], r["partition"], r.get("model_kind", "main")) == setting:
            if _algorithm_name(r) == "exact" and "error" not in r:
                return r
    return None


def ratio_to_exact(row: Dict[str, Any], exact: Optional[Dict[str, Any]]) -> Optional[float]:
    """Exact gossip's measured MB per step over this row's (>1: the row sends less)."""
    if exact is None or "error" in row or not row["mb_per_step"]:
        return None
    return exact["mb_per_step"] / row["mb_per_step"]


#: The header line of the table and the pages' header paragraph (in tables.md).
SAY = snippets(__file__, "tables.md")
TABLE_HEADER = SAY["table header"]


def table_row(row: Dict[str, Any], exact: Optional[Dict[str, Any]]) -> str:
    """The row's line of `TABLE_HEADER`'s table (`exact`: exact gossip's row of its setting)."""
    head = (
        f"| {row['topology']} | {row['partition']} | {row['label']} | {row.get('gamma_text', '—')} | "
        f"{row.get('epochs', '?')} | {row.get('seeds', 1)} |"
    )
    if "error" in row:
        what = "DIVERGED" if row["error"].startswith("diverged") else "FAILED"
        return head + f" {what}: {row['error']} | | | | | | |"
    ratio = ratio_to_exact(row, exact)
    if ratio is None:
        ratio_text = "n/a"
    elif ratio >= 1:
        ratio_text = f"{ratio:.1f}× ({100 * (1 - 1 / ratio):.1f} % fewer)"
    else:
        ratio_text = f"{ratio:.2f}× ({100 * (1 / ratio - 1):.0f} % more)"
    accuracies = ("acc_avg", "acc_local_mean", "acc_local_min")
    cells = [_pct(row[k], row.get(k + "_std")) for k in accuracies]
    comm = dict(row, compute_s=0.0)  # the projected communication part alone
    times = [
        f"{projected_seconds(row, bw):.3g} s (comm {projected_seconds(comm, bw):.3g} s)"
        for _, bw in BANDWIDTHS
    ]
    cells += [f"{row['mb_per_peer']:.3f}", ratio_text, *times]
    return head + " " + " | ".join(cells) + " |"


def _exact_of(rows: Sequence[Dict[str, Any]], row: Dict[str, Any]) -> Optional[Dict]:
    return exact_reference(rows, row["topology"], row["partition"], row.get("model_kind", "main"))


def build_table(rows: Sequence[Dict[str, Any]]) -> str:
    """The markdown table of `rows` (`TABLE_HEADER`), each beside exact gossip of its setting."""
    lines = [TABLE_HEADER, "|" + "---|" * (TABLE_HEADER.count("|") - 1)]
    lines += [table_row(row, _exact_of(rows, row)) for row in rows]
    return "\n".join(lines) + "\n"


#: The CSV's columns, in order.
CSV_FIELDS = tuple(
    """group topology partition label algorithm gamma model parameters peers epochs steps seed
    seeds acc_avg acc_avg_std acc_local_mean acc_local_min mb_per_peer mb_per_step ratio_to_exact
    compute_s rounds critical_bytes projected_s_1gbit projected_s_10gbit run_seconds error""".split()
)


def build_csv(rows: Sequence[Dict[str, Any]]) -> str:
    """The rows as CSV (`CSV_FIELDS`), with each one's ratio to exact gossip and projected times."""
    lines = []
    for row in rows:
        out = {k: row.get(k, "") for k in CSV_FIELDS}
        out.update(seeds=row.get("seeds", 1), group=row.get("model_kind", "main"))
        if "error" not in row:
            ratio = ratio_to_exact(row, _exact_of(rows, row))
            out["ratio_to_exact"] = "" if ratio is None else f"{ratio:.4g}"
            out["projected_s_1gbit"] = f"{projected_seconds(row, BANDWIDTHS[0][1]):.4g}"
            out["projected_s_10gbit"] = f"{projected_seconds(row, BANDWIDTHS[1][1]):.4g}"
        lines.append(["" if v is None else v for v in out.values()])
    return csv_text(CSV_FIELDS, lines)


def header(title: str, generated: str, extra: str = "") -> str:
    """A page's title and header paragraph (`generated`: its "made by" sentence)."""
    return SAY["header"].format(title=title, generated=generated, extra=extra) + "\n\n"
