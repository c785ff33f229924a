"""The dynamic page's tables, its verdict and its two figures, from its rows."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.pages._markdown import csv_text, snippets, table
from experiments.suite.runs import BANDWIDTHS, projected_seconds
from experiments.suite.tables import _pct
from experiments.pages._figures import png, pyplot
from gossip_powersgd.metrics import positive_points

POWERGOSSIP = "PowerGossip r1"
TARGETS = (1e-2, 1e-4)
#: The verdict's sentences (page.md beside this file).
TEXT = snippets(__file__, "page.md")


def _num(value: Optional[float], missing: str = "—") -> str:
    return missing if value is None else f"{value:.3g}"


def consensus_table(rows: Sequence[Dict[str, Any]], budgets: Sequence[float]) -> str:
    """Markdown: relative error at matched bits and bits to reach each target, one row per run."""
    head = ["graph", "algorithm", "steps run", "bits run", "stop"]
    head += [f"rel. error @ {b:.0e} bits" for b in budgets]
    head += [f"bits to rel. error {t:.0e}" for t in TARGETS]
    lines = table(head, [], None)
    for r in rows:
        if "error_text" in r:
            failed = f"| {r['topology']} | {r['label']} | FAILED: {r['error_text']} |"
            lines.append(failed + " |" * (len(head) - 3))
            continue
        cells = [r["topology"], r["label"], str(r["steps"]), f"{r['bits_run']:.3g}", r["stop"]]
        cells += [_num(r["at_budget"][b]) for b in budgets]
        cells += [_num(r["to_reach"][t], f"not reached (> {r['bits_run']:.3g})") for t in TARGETS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def consensus_csv(rows: Sequence[Dict[str, Any]], budgets: Sequence[float]) -> str:
    head = ["topology", "algorithm", "spec", "steps", "bits_run", "stop", "initial_error"]
    head += [f"rel_error_at_{b:g}_bits" for b in budgets] + [f"bits_to_{t:g}" for t in TARGETS]

    def six(value: Optional[float]) -> str:
        return "" if value is None else f"{value:.6g}"

    lines = []
    for r in rows:
        first = [r["topology"], r["label"], r["spec"]]
        if "error_text" in r:
            lines.append(first + [""] * (5 + len(budgets) + len(TARGETS)) + [r["error_text"]])
            continue
        cells = first + [r["steps"], r["bits_run"], r["stop"], r["error0"]]
        cells += [six(r["at_budget"][b]) for b in budgets] + [
            six(r["to_reach"][t]) for t in TARGETS
        ]
        lines.append(cells + [f"{r['seconds']:.1f}", ""])
    return csv_text(head + ["seconds", "error"], lines)


def reach(curve: Sequence[Tuple[float, float]], target: float) -> Optional[float]:
    """The x at which an accuracy curve first reaches `target` (linear between evaluations)."""
    previous = None
    for x, acc in curve:
        if acc >= target:
            if previous is None or previous[1] >= acc:
                return x
            t = (target - previous[1]) / (acc - previous[1])
            return previous[0] + t * (x - previous[0])
        previous = (x, acc)
    return None


def mb_curve(row: Dict[str, Any]) -> List[Tuple[float, float]]:
    return [(x, a) for x, a in row["curve"] if a is not None]


def time_curve(row: Dict[str, Any], bandwidth: float) -> List[Tuple[float, float]]:
    """(projected seconds, averaged-model accuracy) at each evaluation: the run's projected time
    scaled by the evaluation's share of its bytes (a step's traffic is constant on these graphs)."""
    total, mb_total = projected_seconds(row, bandwidth), row["mb_per_peer"] or 1.0
    return [(total * mb / mb_total, acc) for mb, acc in mb_curve(row)]


def training_target(rows: Sequence[Dict[str, Any]]) -> Optional[float]:
    """The accuracy every PowerGossip run reached: the lowest final accuracy among them."""
    finals = [r["acc_avg"] for r in rows if r["label"] == POWERGOSSIP and "error" not in r]
    return min(finals) if finals else None


def reach_table(rows: Sequence[Dict[str, Any]], target: float) -> str:
    """Markdown: MB and projected seconds per peer at which each run first reaches `target`."""
    head = ["graph", "algorithm", "final acc", f"MB to {_pct(target)}"]
    head += [f"projected s to {_pct(target)} @ {name}" for name, _ in BANDWIDTHS]
    cells = []
    for r in (r for r in rows if "error" not in r):
        curves = [mb_curve(r)] + [time_curve(r, bw) for _, bw in BANDWIDTHS]
        cells.append([r["topology"], r["label"], _pct(r["acc_avg"])])
        cells[-1] += [_num(reach(curve, target), "not reached") for curve in curves]
    return "\n".join(table(head, cells, None)) + "\n"


def _pg(rows: Sequence[Dict[str, Any]], topology: str) -> Dict[str, Any]:
    ok = (r for r in rows if r["topology"] == topology and r["label"] == POWERGOSSIP)
    return next((r for r in ok if "error" not in r and "error_text" not in r), {})


def _compare(name: str, values: Dict[str, Optional[float]], schedules, statics, unit: str) -> str:
    """One verdict line: each schedule's cost against each static graph's (lower is better)."""
    parts = []
    for s in schedules:
        for g in statics:
            a, b = values.get(s), values.get(g)
            if a is None and b is None:
                parts.append(f"{s} vs {g}: neither reached it")
            elif a is None or b is None:
                yes, missed = ("no", s) if a is None else ("yes", g)
                parts.append(f"{s} vs {g}: **{yes}** ({missed} did not reach it)")
            else:
                more = "fewer" if a < b else "more" if a > b else "equal"
                parts.append(f"{s} vs {g}: **{'yes' if a < b else 'no'}**, {b / a:.2f}× ({more})")
    costs = ", ".join(
        f"{t} {_num(values.get(t), 'not reached')}" for t in list(schedules) + list(statics)
    )
    return f"- {name} ({unit}: {costs}): " + "; ".join(parts) + "."


def verdict(consensus, training, p: Dict[str, Any], target: Optional[float]) -> List[str]:
    """The question answered from the rows: fewer bytes on a one-peer schedule than on a ring or
    torus? (Its sentences: page.md beside this file.)"""
    graphs, schedules = p["topologies"], p["schedules"]
    args = (schedules, [t for t in graphs if t not in schedules])
    lines = []
    for t in TARGETS:
        values = {g: _pg(consensus, g).get("to_reach", {}).get(t) for g in graphs}
        lines.append(_compare(TEXT["consensus reach"].format(target=t), values, *args, "bits"))
    if target is None:
        return lines

    def mb_to(accuracy: float) -> Dict[str, Optional[float]]:
        pg = {g: _pg(training, g) for g in graphs}
        return {g: reach(mb_curve(pg[g]), accuracy) if pg[g] else None for g in graphs}

    name = TEXT["training reach"].format(target=_pct(target))
    lines.append(_compare(name, mb_to(target), *args, "MB"))
    finals = {g: _pg(training, g).get("acc_avg") for g in graphs}
    text = ", ".join(f"{g} {_pct(a)}" for g, a in finals.items())
    lines.append(TEXT["finals"].format(finals=text))
    static_finals = [finals[g] for g in args[1] if finals.get(g) is not None]
    higher = min(static_finals) if static_finals else None
    if higher is not None and higher > target:
        # The common bar is the weakest run's final accuracy; the static graphs' bar shows whether
        # the schedules' byte saving survives a higher accuracy.
        name = TEXT["higher"].format(target=_pct(higher))
        lines.append(_compare(name, mb_to(higher), *args, "MB"))
    per_step = {g: _pg(training, g).get("mb_per_step") for g in graphs}
    if all(per_step.values()):
        text = ", ".join(f"{g} {v * 1e3:.3g} kB" for g, v in per_step.items())
        lines.append(TEXT["why"].format(per_step=text, epochs=p["epochs"]))
    return lines


def _style(topology: str, label: str, p: Dict[str, Any]) -> Dict[str, Any]:
    order = list(p["topologies"]) + [p["pushsum"][0]]
    style = "--" if label == "exact gossip" else "-" if label == POWERGOSSIP else ":"
    return dict(color=f"C{order.index(topology) % 10}", linestyle=style)


def plots(consensus, training, p: Dict[str, Any]) -> Dict[str, bytes]:
    """dynamic_error_vs_bits.png and dynamic_accuracy.png (vs MB and vs projected time)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in (r for r in consensus if "history" in r):
        pts, label = positive_points(r["history"]), f"{r['topology']} {r['label']}"
        x, y = [x["bits_per_peer"] for x in pts], [x["error"] / r["error0"] for x in pts]
        ax.plot(x, y, label=label, linewidth=1.4, **_style(r["topology"], r["label"], p))
    for t in TARGETS:
        ax.axhline(t, color="0.6", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bits sent per peer")
    ax.set_ylabel("relative error ‖x_i − x̄‖² / initial")
    ax.set_title(f"consensus, {p['problem']} per peer", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    out = {"dynamic_error_vs_bits.png": png(fig)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in (r for r in training if "error" not in r):
        style, mb = _style(r["topology"], r["label"], p), [(x, a) for x, a in mb_curve(r) if x > 0]
        label = f"{r['topology']} {r['label']}"
        axes[0].plot(
            [x for x, _ in mb], [100 * a for _, a in mb], marker="o", ms=3, label=label, **style
        )
        tc = time_curve(r, BANDWIDTHS[0][1])
        axes[1].plot([x for x, _ in tc], [100 * a for _, a in tc], marker="o", ms=3, **style)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("MB sent per peer")
    axes[1].set_xlabel(f"projected wall time per peer (s) @ {BANDWIDTHS[0][0]}")
    for ax in axes:
        ax.set_ylabel("averaged-model test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    out["dynamic_accuracy.png"] = png(fig)
    return out
