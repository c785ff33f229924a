"""The training page's pictures and curve data: averaged-model accuracy vs MB sent per peer and vs
epochs, one panel per setting, from each run's evaluation history."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from experiments.pages._figures import png, pyplot
from experiments.pages._markdown import csv_text

from .convergence import common_target
from .design import noniid_grid

#: training_curves.csv's columns: (name, its cell from a run and one of its evaluations).
CURVE_FIELDS = (
    ("group", lambda r, e: r.get("model_kind", "main")),
    ("topology", lambda r, e: r["topology"]),
    ("partition", lambda r, e: r["partition"]),
    ("model", lambda r, e: r.get("model", "")),
    ("label", lambda r, e: r["label"]),
    ("algorithm", lambda r, e: r["algorithm"]),
    ("seed", lambda r, e: r.get("seed", 0)),
    ("epoch", lambda r, e: e["epoch"]),
    ("mb_sent_per_peer", lambda r, e: f"{e['mb']:.6g}"),
    ("acc_avg", lambda r, e: e["acc_avg"]),
    ("acc_local_mean", lambda r, e: f"{e['acc_local_mean']:.6g}"),
    ("acc_local_min", lambda r, e: e["acc_local_min"]),
)


def curves_csv(rows: Sequence[Dict[str, Any]]) -> str:
    """Every run's evaluation history, one line per evaluation."""
    lines = ([cell(r, e) for _, cell in CURVE_FIELDS] for r in rows for e in r.get("evals") or [])
    return csv_text([name for name, _ in CURVE_FIELDS], lines)


def panels(
    state: Dict[str, Any], headline: Sequence[Dict[str, Any]]
) -> List[Tuple[str, List[Dict]]]:
    """(title, rows) of each panel: iid (seed means), Dirichlet, the wide model."""
    plan, wide = state["plan"], state["wide"]
    where = f"{plan['topology']} {plan['iid']}"
    seeds = ", ".join(str(s) for s in plan["seeds"])
    out = [(f"{where}, cnn1d (mean over seeds {seeds} where run)", list(headline))]
    noniid = list(state["noniid"])
    extra = [r for r in noniid_grid(state) if r["spec"] not in {x["spec"] for x in noniid}]
    if noniid:
        out.append((f"{plan['topology']} {plan['noniid']}, cnn1d, seed 0", noniid + extra))
    if wide:
        out.append((f"{where}, {wide[0].get('model', 'wide')}, seed 0", list(wide)))
    return out


def plot_training(state: Dict[str, Any], headline: Sequence[Dict[str, Any]]) -> Dict[str, bytes]:
    """{training_accuracy_vs_mb.png, training_accuracy_vs_epochs.png: their PNG bytes} ({} when
    no run has an evaluation history yet)."""
    plt = pyplot()

    groups = [
        (title, [r for r in rows if "error" not in r and r.get("evals")])
        for title, rows in panels(state, headline)
    ]
    groups = [(t, rows) for t, rows in groups if rows]
    if not groups:
        return {}
    pictures = {}
    palette = plt.get_cmap("tab10").colors
    labels = list(dict.fromkeys(r["label"].split(",")[0] for _, rows in groups for r in rows))
    colour = {label: palette[i % len(palette)] for i, label in enumerate(labels)}
    for x_key, file_name, x_label in (
        ("mb", "training_accuracy_vs_mb.png", "MB sent per peer (log scale)"),
        ("epoch", "training_accuracy_vs_epochs.png", "epoch"),
    ):
        fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 4.6), squeeze=False)
        for ax, (title, rows) in zip(axes.flat, groups):
            for r in rows:
                points = [
                    (e[x_key], 100 * e["acc_avg"])
                    for e in r["evals"]
                    if e["acc_avg"] is not None and (x_key != "mb" or e["mb"] > 0)
                ]
                legend = r["label"].split(",")[0]
                xs, ys = [p[0] for p in points], [p[1] for p in points]
                ax.plot(xs, ys, marker="o", ms=2, lw=1.2, label=legend, color=colour[legend])
            target = common_target(rows)
            if target is not None:
                label = f"common target {100 * target:.1f} %"
                ax.axhline(100 * target, color="gray", ls="--", lw=0.8, label=label)
            if x_key == "mb":
                ax.set_xscale("log")
            lows = [100 * e["acc_avg"] for r in rows for e in r["evals"][len(r["evals"]) // 3 :]]
            if lows:
                ax.set_ylim(max(0.0, min(lows) - 5), min(100.0, max(lows) + 2))
            ax.set_xlabel(x_label)
            ax.set_ylabel("averaged-model test accuracy (%)")
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        pictures[file_name] = png(fig, dpi=100)
    return pictures
