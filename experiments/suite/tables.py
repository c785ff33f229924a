"""The suite's tables: markdown rows and CSV from the rows' data, and the pages' header line."""

from __future__ import annotations

import csv
import io
import math
from typing import Any, Dict, Optional, Sequence

from experiments.engine.provenance import page_commit, utc_now

from .runs import BANDWIDTHS, communication_seconds, projected_seconds


def _pct(value: Optional[float], std: Optional[float] = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    text = f"{100 * value:.2f}"
    if std is not None:
        text += f" ± {100 * std:.2f}"
    return text + " %"


def _algorithm_name(row: Dict[str, Any]) -> str:
    from gossip_powersgd.algorithms.registry import split_spec

    return split_spec(str(row.get("algorithm", "")))[0]


def exact_reference(
    rows: Sequence[Dict[str, Any]], topology: str, partition: str, kind: str = "main"
) -> Optional[Dict]:
    """Exact gossip's row of the same setting (and the same group: main, headline or wide)."""
    for r in rows:
        if (
            _algorithm_name(r) == "exact"
            and r["topology"] == topology
            and r["partition"] == partition
            and r.get("model_kind", "main") == kind
            and "error" not in r
        ):
            return r
    return None


def ratio_to_exact(row: Dict[str, Any], exact: Optional[Dict[str, Any]]) -> Optional[float]:
    """Exact gossip's measured MB per step over this row's (>1: the row sends less)."""
    if exact is None or "error" in row or not row["mb_per_step"]:
        return None
    return exact["mb_per_step"] / row["mb_per_step"]


TABLE_HEADER = (
    "| topology | partition | algorithm | γ | epochs | seeds | averaged-model acc | "
    "local acc mean | local acc min | MB sent / peer | exact MB ÷ MB (per step) | "
    "projected time @ 1 Gbit/s (comm part) | @ 10 Gbit/s (comm part) |"
)


def table_row(row: Dict[str, Any], exact: Optional[Dict[str, Any]]) -> str:
    head = (
        f"| {row['topology']} | {row['partition']} | {row['label']} | {row.get('gamma_text', '—')} | "
        f"{row.get('epochs', '?')} | {row.get('seeds', 1)} |"
    )
    if "error" in row:
        return (
            head + f" {'DIVERGED' if row['error'].startswith('diverged') else 'FAILED'}: "
            f"{row['error']} | | | | | | |"
        )
    ratio = ratio_to_exact(row, exact)
    ratio_text = (
        "n/a"
        if ratio is None
        else f"{ratio:.1f}× ({100 * (1 - 1 / ratio):.1f} % fewer)"
        if ratio >= 1
        else f"{ratio:.2f}× ({100 * (1 / ratio - 1):.0f} % more)"
    )
    times = " | ".join(
        f"{projected_seconds(row, bw):.3g} s (comm {communication_seconds(row, bw):.3g} s)"
        for _, bw in BANDWIDTHS
    )
    return (
        head + f" {_pct(row['acc_avg'], row.get('acc_avg_std'))} | "
        f"{_pct(row['acc_local_mean'], row.get('acc_local_mean_std'))} | "
        f"{_pct(row['acc_local_min'], row.get('acc_local_min_std'))} | {row['mb_per_peer']:.3f} | "
        f"{ratio_text} | {times} |"
    )


def build_table(rows: Sequence[Dict[str, Any]]) -> str:
    lines = [TABLE_HEADER, "|" + "---|" * (TABLE_HEADER.count("|") - 1)]
    for row in rows:
        lines.append(
            table_row(
                row,
                exact_reference(
                    rows, row["topology"], row["partition"], row.get("model_kind", "main")
                ),
            )
        )
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    "group",
    "topology",
    "partition",
    "label",
    "algorithm",
    "gamma",
    "model",
    "parameters",
    "peers",
    "epochs",
    "steps",
    "seed",
    "seeds",
    "acc_avg",
    "acc_avg_std",
    "acc_local_mean",
    "acc_local_min",
    "mb_per_peer",
    "mb_per_step",
    "ratio_to_exact",
    "compute_s",
    "rounds",
    "critical_bytes",
    "projected_s_1gbit",
    "projected_s_10gbit",
    "run_seconds",
    "error",
)


def build_csv(rows: Sequence[Dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for row in rows:
        out = {k: row.get(k, "") for k in CSV_FIELDS}
        out["seeds"] = row.get("seeds", 1)
        out["group"] = row.get("model_kind", "main")
        if "error" not in row:
            ratio = ratio_to_exact(
                row,
                exact_reference(
                    rows, row["topology"], row["partition"], row.get("model_kind", "main")
                ),
            )
            out["ratio_to_exact"] = "" if ratio is None else f"{ratio:.4g}"
            out["projected_s_1gbit"] = f"{projected_seconds(row, BANDWIDTHS[0][1]):.4g}"
            out["projected_s_10gbit"] = f"{projected_seconds(row, BANDWIDTHS[1][1]):.4g}"
        writer.writerow({k: ("" if v is None else v) for k, v in out.items()})
    return buffer.getvalue()


def generated_sentence(command: str, seconds: float) -> str:
    """ "Generated by `command` on <UTC date> in N s (commit C)." for a page and the README."""
    return f"Generated by `{command}` on {utc_now()} in {seconds:.0f} s (commit {page_commit()})."


def header(
    title: str, command: str, seconds: float, extra: str = "", generated: Optional[str] = None
) -> str:
    """A page's title and header paragraph (`generated`: that sentence, if already made)."""
    generated = generated or generated_sentence(command, seconds)
    return (
        f"# {title}\n\n{generated} "
        f"Backend: `local` (every peer a thread of one process, `LocalCluster`); the MPI transport "
        f"runs the same algorithm code and MPI ≡ local equality is tested in tests/, not here. "
        f"{extra}\n\n"
    )
