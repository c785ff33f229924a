"""The churn page's prose around its tables (the set-up: the recipe, the per-step rate; the two
sections; the limits of what it measures) and the page's files (`render_page`)."""

from __future__ import annotations

import json
import math
from typing import Any, Dict

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._markdown import fill, template
from experiments.suite.runs import BASE, QUICK_BASE
from experiments.suite.tables import header

from .tables import grid_cells, grid_list, grid_table, grid_verdict, spread_verdict, join_cells
from .tables import join_table, join_verdict, plot, soak_section


def wall_span(rows: Rows) -> str:
    """ "Wall time about M min (first start to last finish, from the rows)": each row's start is
    its finish (to the minute) less its run time."""
    import datetime

    if not rows.records:
        return ""
    fmt = "%Y-%m-%d %H:%M UTC"
    ends = [datetime.datetime.strptime(r.finished, fmt) for r in rows.records]
    starts = [e - datetime.timedelta(seconds=r.seconds) for e, r in zip(ends, rows.records)]
    minutes = (max(ends) - min(starts)).total_seconds() / 60
    span = "under a minute" if minutes < 1 else f"about {minutes:.0f} min"
    return (
        f"Wall time {span} from the first run's start to the last one's end "
        "(finish times are to the minute), on 2 CPU cores shared with other jobs."
    )


def page_text(rows: Rows, s, cells, joins, recipe, generated: str) -> str:
    """churn.md without its soak section (its fixed text: page.md beside this file)."""
    text = header(
        f"Training through churn, in-process{' (--quick)' if s['quick'] else ''}",
        rows.command,
        0.0,
        "Churn here is scheduled: peers leave and join cooperatively at steps every peer knows. "
        + wall_span(rows),
        generated=generated,
    )
    spe, still = s["steps_per_epoch"], [c["acc_avg"] for (_, _, r), c in cells.items() if r == 0]
    soaked = any(r.config.get("section") == "soak" for r in rows.records)
    unfinished = f"**Unfinished: {len(rows.records)} of {rows.planned} planned runs have rows.**"
    return text + fill(
        template(__file__),
        unfinished="" if rows.complete else unfinished + "\n\n",
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
        grid_verdict="\n".join(grid_verdict(cells, s["rates"]) + spread_verdict(cells)),
        grid_table=grid_table(cells, spe),
        join_verdict="\n".join(join_verdict(joins)),
        join_table=join_table(joins, cells, s["join_topology"]),
        soak=SOAKED if soaked else NOT_SOAKED,
        level=f"the no-churn rows' averaged models reach {100 * min(still):.1f}–"
        f"{100 * max(still):.1f} % test accuracy (10 classes)"
        if still
        else "no no-churn rows yet",
    )


SOAKED = (
    "Real kills, stops, cuts and restarts are in the soak below (torch backend, one process per "
    "host), on a small problem, not on this recipe."
)
NOT_SOAKED = (
    "The emulated-cluster soak (torch backend, one process per host, real kills, stops, cuts and "
    "restarts) is not in these rows."
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
    recipe = QUICK_BASE if s["quick"] else BASE
    text = page_text(rows, s, cells, joins, recipe, made_by(rows))
    text += soak_section(rows)
    return {
        "churn.md": text,
        "churn.json": json.dumps(data, indent=1, default=_finite) + "\n",
        "churn.png": plot(cells, s),
    }


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)
