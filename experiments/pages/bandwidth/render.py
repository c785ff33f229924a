"""bandwidth.md, bandwidth.json and bandwidth.png (`plot`) from the rows (`figures.collect`); pure."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from typing import Any, Dict, Mapping

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._figures import png

from experiments.pages._markdown import fill

from . import compose, faults, text, text_network
from .compose import rate_text
from .figures import collect, schedule
from .recipe import BY_KEY, Setting, setting
from .text import TEXT


def render(rows: Rows) -> Outputs:
    s = setting(rows.quick)
    data = {r.key: r.row for r in rows.records}
    f = collect(s, data)
    facts = run_facts(rows, data)
    page = "\n".join(
        [
            f"# Time to accuracy under bandwidth limits{' (--quick)' if rows.quick else ''}",
            "",
            made_by(rows) + " " + facts["sentence"],
            "",
            *text.method(s, f),
            *text.answer_section(s, f),
            *text.accuracy_section(s, f),
            *text_network.cost_sections(s, f),
            *text.time_sections(s, f),
            *text_network.eval_section(s, f),
            *text_network.slow_section(s, f),
            *text_network.e2e_section(s, f),
            *faults.section(s.faults, data),
            *text_network.notes(s, f),
        ]
    )
    out: Outputs = {"bandwidth.md": page.rstrip() + "\n"}
    f = dict(f, faults={k: v for k, v in data.items() if k.startswith("fault/")})
    out["bandwidth.json"] = json.dumps(_json(f, facts), indent=1, sort_keys=True) + "\n"
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
    nice = sorted({r["nice"] for r in measured if "nice" in r})
    cpus = sorted({r["cpus"] for r in measured if "cpus" in r})
    parts = ", ".join(f"{kind} {compose.seconds_text(v)}" for kind, v in seconds.items())
    sentence = fill(TEXT["run time"], parts=parts)
    if len(by_commit) > 1:
        commits = "; ".join(
            f"{commit}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items())
            for commit, kinds in by_commit.items()
        )
        sentence += " " + fill(TEXT["commits"], commits=commits)
    if loads:
        low, high = min(x[0] for x in loads), max(x[0] for x in loads)
        cpus = ", ".join(map(str, cpus)) or "?"
        nice = f", niceness {', '.join(map(str, nice))}" if nice else ""
        sentence += " " + fill(TEXT["load"], cpus=cpus, low=low, high=high, nice=nice)
    return {"seconds": dict(seconds), "sentence": sentence, "loads": loads}


def _json(f: Dict[str, Any], facts: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(f)
    out["machine_seconds"] = facts["seconds"]
    out["accuracy"] = {
        t: {k: {x: y for x, y in v.items() if x not in ("curves",)} for k, v in per.items()}
        for t, per in f["accuracy"].items()
    }
    return out


def plot(s: Setting, f: Mapping[str, Any]) -> bytes:
    """bandwidth.png: the averaged model's accuracy against wall time, one panel per topology and
    link rate, hosts with a core each, training time (the seeds' mean curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = [t for t in s.topologies if t in f["costs"]]
    rates = [r for r in s.rates if any(r in f["costs"][t] for t in topologies)]
    fig, axes = plt.subplots(
        len(topologies),
        len(rates),
        figsize=(3.6 * len(rates), 3.0 * len(topologies)),
        squeeze=False,
        sharey=True,
    )
    colors = plt.get_cmap("tab10")
    for i, topology in enumerate(topologies):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            c = f["costs"][topology].get(rate)
            if c is None:
                ax.set_visible(False)
                continue
            for n, key in enumerate(s.algorithms):
                entry = f["accuracy"][topology].get(key, {})
                plan = schedule(s, c["steps"], c["eval"], key, "core_each")
                if plan is None or "mean_curve" not in entry:
                    continue
                plan = dataclasses.replace(plan, per_eval=0.0)
                xs = [plan.training(step) for step, _ in entry["mean_curve"]]
                ys = [100 * acc for _, acc in entry["mean_curve"]]
                style = "--" if key.startswith(("choco", "powersgd", "exact-h4")) else "-"
                ax.plot(xs, ys, style, color=colors(n), lw=1.2, label=BY_KEY[key].label)
            if f["target"] is not None:
                ax.axhline(100 * f["target"], color="gray", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.set_title(f"{topology}, {rate_text(rate)}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(topologies) - 1:
                ax.set_xlabel("training wall time, a core per host (s)", fontsize=8)
            if j == 0:
                ax.set_ylabel("averaged-model accuracy (%)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels) or 1), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return png(fig, dpi=100)
