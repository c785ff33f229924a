"""bandwidth.png: the averaged model's accuracy against wall time, one panel per topology and link
rate, hosts with a core each, training time (the seeds' mean curve)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from experiments.pages._figures import png

from .compose import rate_text
from .figures import schedule
from .recipe import BY_KEY, Setting


def plot(s: Setting, f: Mapping[str, Any]) -> bytes:
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
