"""The two figures of the dynamic-topologies page (consensus error vs bits, accuracy vs MB and time)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from experiments.consensus.matched import positive_points as _positive
from gossip_powersgd.utils import atomic_write

from .dynamic_design import ALGORITHMS, POWERGOSSIP, TARGETS
from .runs import BANDWIDTHS, projected_seconds


def training_curve_time(row: Dict[str, Any], bandwidth: float) -> List[Tuple[float, float]]:
    """(projected seconds, averaged-model accuracy) at each evaluation: the run's projected time
    scaled by the evaluation's share of the steps (both the counters and compute grow per step)."""
    total = projected_seconds(row, bandwidth)
    mb_total = row["mb_per_peer"] or 1.0
    # The curve holds (MB, accuracy); a step's traffic is constant on these graphs, so MB share = step share.
    return [(total * mb / mb_total, acc) for mb, acc in row.get("curve", []) if acc is not None]


def _style(topology: str, label: str, p: Dict[str, Any]) -> Dict[str, Any]:
    order = list(p["topologies"]) + [p["pushsum"][0]]
    return dict(
        color=f"C{order.index(topology) % 10}",
        linestyle="--" if label == ALGORITHMS[0][0] else "-" if label == POWERGOSSIP else ":",
    )


def plot_consensus(rows: Sequence[Dict[str, Any]], p: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in rows:
        if "history" not in r:
            continue
        pts = _positive(r["history"])
        ax.plot(
            [x["bits_per_peer"] for x in pts],
            [x["error"] / r["error0"] for x in pts],
            label=f"{r['topology']} {r['label']}",
            linewidth=1.4,
            **_style(r["topology"], r["label"], p),
        )
    for t in TARGETS:
        ax.axhline(t, color="0.6", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bits sent per peer")
    ax.set_ylabel("relative error ‖x_i − x̄‖² / initial")
    ax.set_title(f"consensus, {p['problem']} per peer", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    _save(fig, path)


def plot_training(rows: Sequence[Dict[str, Any]], p: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in rows:
        if "error" in r:
            continue
        style = _style(r["topology"], r["label"], p)
        mb = [(x, a) for x, a in r["curve"] if a is not None and x > 0]
        axes[0].plot(
            [x for x, _ in mb],
            [100 * a for _, a in mb],
            marker="o",
            ms=3,
            label=f"{r['topology']} {r['label']}",
            **style,
        )
        tc = training_curve_time(r, BANDWIDTHS[0][1])
        axes[1].plot([x for x, _ in tc], [100 * a for _, a in tc], marker="o", ms=3, **style)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("MB sent per peer")
    axes[1].set_xlabel(f"projected wall time per peer (s) @ {BANDWIDTHS[0][0]}")
    for ax in axes:
        ax.set_ylabel("averaged-model test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(fig)
    atomic_write(path, buffer.getvalue())
