"""The churn page's files from its rows alone (`render_page`): churn.md (page.md filled in with the
tables and verdicts of `tables`, then the soak section), churn.json and churn.png (`plot`)."""

from __future__ import annotations

import datetime
import json
from typing import Any, Dict

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._figures import png
from experiments.pages._markdown import fill, template
from experiments.suite.runs import BASE, QUICK_BASE
from experiments.suite.tables import header

from .tables import TEXT, Cell, grid_cells, grid_list, grid_table, grid_verdict, join_cells
from .tables import join_table, join_verdict, soak_section


def wall_span(rows: Rows) -> str:
    """ "Wall time about M min ..." from the first start to the last finish: each row's start is
    its finish (to the minute) less its run time."""
    if not rows.records:
        return ""
    ends = [datetime.datetime.strptime(r.finished, "%Y-%m-%d %H:%M UTC") for r in rows.records]
    starts = [e - datetime.timedelta(seconds=r.seconds) for e, r in zip(ends, rows.records)]
    minutes = (max(ends) - min(starts)).total_seconds() / 60
    return fill(TEXT["wall"], span="under a minute" if minutes < 1 else f"about {minutes:.0f} min")


def page_text(rows: Rows, s: Dict[str, Any], cells, joins) -> str:
    """churn.md without its soak section (its fixed text: page.md beside this file)."""
    recipe = QUICK_BASE if s["quick"] else BASE
    title = f"Training through churn, in-process{' (--quick)' if s['quick'] else ''}"
    extra = TEXT["header"] + " " + wall_span(rows)
    text = header(title, rows.command, 0.0, extra, generated=made_by(rows))
    spe, still = s["steps_per_epoch"], [c["acc_avg"] for (_, _, r), c in cells.items() if r == 0]
    soaked = any(r.config.get("section") == "soak" for r in rows.records)
    unfinished = fill(TEXT["unfinished"], made=len(rows.records), planned=rows.planned) + "\n\n"
    level = "no no-churn rows yet"
    if still:
        level = fill(TEXT["level"], low=100 * min(still), high=100 * max(still))
    return text + fill(
        template(__file__),
        unfinished="" if rows.complete else unfinished,
        **{k: s[k] for k in ("model", "epochs", "down_steps", "down_epochs", "joiner")},
        **{k: s[k] for k in ("join_topology", "leave_step", "join_step")},
        **{k: recipe[k] for k in ("dataset", "lr")},
        n=s["topologies"][0].split(":")[1],
        momentum=recipe.get("momentum", 0),
        batch=recipe["batch_size"],
        spe=spe,
        steps=s["epochs"] * spe,
        schedule=recipe.get("schedule", "constant"),
        warmup=recipe.get("warmup_epochs", 0),
        seeds=", ".join(map(str, s["seeds"])),
        rates=", ".join(f"{100 * r:g} % → rate={r / spe:.4g}" for r in s["rates"]),
        grid_verdict="\n".join(grid_verdict(cells, s["rates"])),
        grid_table=grid_table(cells, spe),
        join_verdict="\n".join(join_verdict(joins)),
        join_table=join_table(joins, cells, s["join_topology"]),
        soak=TEXT["soaked" if soaked else "not soaked"],
        level=level,
    )


def render_page(rows: Rows, s: Dict[str, Any]) -> Outputs:
    """churn.md, churn.json and churn.png."""
    cells, joins = grid_cells(rows), join_cells(rows)
    data = {
        "command": rows.command,
        "complete": rows.complete,
        "setting": {k: v for k, v in s.items() if k != "algorithms"},
        "algorithms": [list(a) for a in s["algorithms"]],
        "grid": grid_list(cells),
        "join": [dict(algorithm=label, mode=mode, **cell) for (label, mode), cell in joins.items()],
    }
    return {
        "churn.md": page_text(rows, s, cells, joins) + soak_section(rows),
        "churn.json": json.dumps(data, indent=1, default=str) + "\n",
        "churn.png": plot(cells, s),
    }


#: The plot's rows: (field, axis label, scale).
PANELS = (
    ("acc_avg", "averaged-model acc (%)", 100.0),
    ("consensus_distance", "consensus distance", 1.0),
    ("average_shift_total", "average shift (sum)", 1.0),
)


def plot(cells: Dict[Cell, Dict[str, Any]], s: Dict[str, Any]) -> bytes:
    """Averaged-model accuracy, consensus distance and average shift against the churn rate,
    one column per topology, one line per algorithm (error bars: std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(s["topologies"])
    fig, axes = plt.subplots(3, n, figsize=(5.2 * n, 9.5), squeeze=False)
    for col, topology in enumerate(s["topologies"]):
        for row, (field, name, scale) in enumerate(PANELS):
            ax = axes[row][col]
            for label, _ in s["algorithms"]:
                keys = [(topology, label, r) for r in s["rates"] if (topology, label, r) in cells]
                pts = [(100 * k[2], cells[k]) for k in keys]
                if not pts:
                    continue
                ax.errorbar(
                    [x for x, _ in pts],
                    [scale * c[field] for _, c in pts],
                    yerr=[scale * (c[field + "_std"] or 0.0) for _, c in pts],
                    marker="o",
                    capsize=3,
                    label=label,
                )
            values = [cells[c][field] for c in cells if c[0] == topology]
            if field == "consensus_distance" and values and min(values) > 0:
                ax.set_yscale("log")  # exact gossip's and the compressed ones' differ by decades
            ax.set(xlabel="churn (% of peers leaving per epoch)", ylabel=name)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(topology)
                ax.legend(fontsize=8)
    fig.tight_layout()
    return png(fig)
