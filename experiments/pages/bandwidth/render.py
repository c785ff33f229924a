"""bandwidth.md, bandwidth.json and bandwidth.png (`plot`) from the rows (`figures.collect`); pure."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from typing import Any, Dict, Mapping

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._figures import png
from experiments.pages._markdown import fill

from . import faults, text, text_network
from .compose import rate_text, seconds_text
from .figures import collect, schedule
from .recipe import BY_KEY, Setting, setting
from .text import TEXT


def render(rows: Rows) -> Outputs:
    s, data = setting(rows.quick), {r.key: r.row for r in rows.records}
    f, facts = collect(s, data), run_facts(rows, data)
    net = text_network
    page = [f"# Time to accuracy under bandwidth limits{' (--quick)' if rows.quick else ''}", ""]
    page += [made_by(rows) + " " + facts["sentence"], "", *text.method(s, f)]
    page += text.answer_section(s, f) + text.accuracy_section(s, f) + net.cost_sections(s, f)
    page += text.time_sections(s, f) + net.eval_section(s, f) + net.slow_section(s, f)
    page += net.e2e_section(s, f) + faults.section(s.faults, data) + net.notes(s, f)
    out: Outputs = {"bandwidth.md": "\n".join(page).rstrip() + "\n"}
    accuracy = {
        t: {k: {x: y for x, y in v.items() if x != "curves"} for k, v in per.items()}
        for t, per in f["accuracy"].items()
    }
    shown = dict(f, accuracy=accuracy, machine_seconds=facts["seconds"])
    shown["faults"] = {k: v for k, v in data.items() if k.startswith("fault/")}
    out["bandwidth.json"] = json.dumps(shown, indent=1, sort_keys=True) + "\n"
    if f["times"]:
        out["bandwidth.png"] = plot(s, f)
    return out


def run_facts(rows: Rows, data: Mapping[str, Dict[str, Any]]) -> Dict[str, Any]:
    """What the rows say about how they were made: machine time by kind, load, niceness, cores."""
    seconds: Dict[str, float] = defaultdict(float)
    by_commit: Dict[str, Counter] = defaultdict(Counter)
    for record in rows.records:
        seconds[record.key.split("/")[0]] += record.seconds
        by_commit[record.commit][record.key.split("/")[0]] += 1
    measured = [r for k, r in data.items() if k.split("/")[0] in ("alone", "timing", "e2e")]
    loads = [x for r in measured for x in (r.get("load_before"), r.get("load_after")) if x]
    parts = ", ".join(f"{kind} {seconds_text(v)}" for kind, v in seconds.items())
    sentence = fill(TEXT["run time"], parts=parts)
    if len(by_commit) > 1:
        commits = "; ".join(
            f"{commit}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items())
            for commit, kinds in by_commit.items()
        )
        sentence += " " + fill(TEXT["commits"], commits=commits)
    if loads:
        nice = ", ".join(str(n) for n in sorted({r["nice"] for r in measured if "nice" in r}))
        cpus = ", ".join(str(n) for n in sorted({r["cpus"] for r in measured if "cpus" in r}))
        low, high = min(x[0] for x in loads), max(x[0] for x in loads)
        fields = dict(
            cpus=cpus or "?", low=low, high=high, nice=f", niceness {nice}" if nice else ""
        )
        sentence += " " + fill(TEXT["load"], **fields)
    return {"seconds": dict(seconds), "sentence": sentence}


def plot(s: Setting, f: Mapping[str, Any]) -> bytes:
    """bandwidth.png: the averaged model's accuracy against wall time, one panel per topology and
    link rate, hosts with a core each, training time (the seeds' mean curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = [t for t in s.topologies if t in f["costs"]]
    rates = [r for r in s.rates if any(r in f["costs"][t] for t in topologies)]
    rows, cols = len(topologies), len(rates)
    size = (3.6 * cols, 3.0 * rows)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, sharey=True)
    colors = plt.get_cmap("tab10")
    for (i, topology), (j, rate) in (
        (a, b) for a in enumerate(topologies) for b in enumerate(rates)
    ):
        ax, c = axes[i][j], f["costs"][topology].get(rate)
        if c is None:
            ax.set_visible(False)
            continue
        for n, key in enumerate(s.algorithms):
            curve = f["accuracy"][topology].get(key, {}).get("mean_curve")
            plan = schedule(s, c["steps"], c["eval"], key, "core_each")
            if plan is None or curve is None:
                continue
            plan = dataclasses.replace(plan, per_eval=0.0)
            xs, ys = [plan.training(step) for step, _ in curve], [100 * acc for _, acc in curve]
            style = "--" if key.startswith(("choco", "powersgd", "exact-h4")) else "-"
            ax.plot(xs, ys, style, color=colors(n), lw=1.2, label=BY_KEY[key].label)
        if f["target"] is not None:
            ax.axhline(100 * f["target"], color="gray", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(f"{topology}, {rate_text(rate)}", fontsize=9)
        ax.grid(alpha=0.3)
        if i == rows - 1:
            ax.set_xlabel("training wall time, a core per host (s)", fontsize=8)
        if j == 0:
            ax.set_ylabel("averaged-model accuracy (%)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels) or 1), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return png(fig, dpi=100)
