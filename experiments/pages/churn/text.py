"""The churn page's prose around its tables (the set-up: the recipe, the per-step rate; the two
sections; the limits of what it measures) and the page's files (`render_page`)."""

from __future__ import annotations

import json
import math
from typing import Any, Dict

from experiments.engine import Outputs, Rows, made_by
from experiments.suite.runs import BASE, QUICK_BASE
from experiments.suite.tables import header

from .tables import (
    grid_cells,
    grid_list,
    grid_table,
    grid_verdict,
    spread_verdict,
    join_cells,
    join_table,
    join_verdict,
    plot,
    soak_section,
)


def setup_text(s: Dict[str, Any], recipe: Dict[str, Any]) -> str:
    spe, n = s["steps_per_epoch"], s["topologies"][0].split(":")[1]
    rates = ", ".join(f"{100 * r:g} % → rate={r / spe:.4g}" for r in s["rates"])
    return (
        f"Recipe: {recipe['dataset']}, model `{s['model']}`, {n} peers, iid, SGD lr "
        f"{recipe['lr']} momentum {recipe.get('momentum', 0)}, batch {recipe['batch_size']} "
        f"per peer, {s['epochs']} epochs of {spe} steps ({s['epochs'] * spe} steps), "
        f"{recipe.get('schedule', 'constant')} schedule after "
        f"{recipe.get('warmup_epochs', 0)} warm-up epochs; seeds {', '.join(map(str, s['seeds']))} "
        "(the seed of both the training and the churn schedule). Every run: "
        "`gossip_powersgd.run(config)` with `on_peer_loss: continue`.\n\n"
        "**Churn.** Random churn `churn: rate=R,down=D,seed=S`: at every step each live peer "
        "leaves with probability R and comes back D steps later (handed its state by its "
        "neighbours, `churn_join: average`). The page's churn rate is the share of the peers "
        "that leave per epoch; the per-step rate is that share divided by the steps per epoch, "
        f"R = share / {spe} (to first order: a peer leaves within an epoch with probability "
        f"1 − (1 − R)^{spe} ≈ share): {rates}. D = {s['down_steps']} steps "
        f"({s['down_epochs']:g} epochs). A change takes effect at the start of its step on "
        "every peer; the survivors gossip on the repaired graph (ring and exponential are rebuilt "
        "on the live peers), every algorithm's state of a kept edge carries over. The churn "
        "grid's no-churn rows run the same code with R = 0. The schedule depends only on "
        "(R, D, seed, peers): at a given rate and seed every algorithm and topology sees the "
        "same departures at the same steps (a paired comparison).\n\n"
        "**Figures.** Accuracies are of the members at the end: the averaged model's (the "
        "members' average, evaluated) and each member's own (mean and min over members); "
        "consensus distance = mean over members of ‖x_i − x̄‖² at the end. *Average shift* is "
        "the library's `average_shift_total`: the sum over membership changes of ‖x̄_after − "
        "x̄_before‖ (the members' average, over every parameter). Between changes every "
        "algorithm here keeps the members' average exactly (the invariant of "
        "tests/membership/test_peer.py), so the shift is the whole drift of the survivors' average: "
        "a leaver takes its share with it, a joiner adds its handed model. Departures and "
        "peer-steps away come from the schedule itself (the changes the run applied). "
        "Choco sign uses γ = 1, the value the training page's γ sweep chose (ring:8), not tuned "
        "again for 16 peers or per topology.\n\n"
    )


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
    """churn.md without its soak section."""
    quick = " (--quick)" if s["quick"] else ""
    unfinished = (
        ""
        if rows.complete
        else f"**Unfinished: {len(rows.records)} of {rows.planned} planned runs have rows.**\n\n"
    )
    text = header(
        f"Training through churn, in-process{quick}",
        rows.command,
        0.0,
        "Churn here is scheduled: peers leave and join cooperatively at steps every peer knows. "
        + wall_span(rows),
        generated=generated,
    )
    text += unfinished + setup_text(s, recipe)
    text += (
        "## Accuracy, consensus and the average's shift against the churn rate\n\n"
        + "\n".join(grid_verdict(cells, s["rates"]) + spread_verdict(cells))
        + "\n\nMean ± std over the seeds; Δ: the averaged-model accuracy's difference to the same "
        "algorithm's no-churn row (in percentage points).\n\n"
        + grid_table(cells, s["steps_per_epoch"])
        + "\n![accuracy, consensus distance and average shift vs churn rate](churn.png)\n\n"
    )
    text += join_section(s, cells, joins)
    text += limits_text(cells, any(r.config.get("section") == "soak" for r in rows.records))
    return text + "Data: [churn.json](churn.json) (every cell, mean and std), rows churn.jsonl.\n\n"


def join_section(s, cells, joins) -> str:
    spe, joiner = s["steps_per_epoch"], s["joiner"]
    return (
        "## Rejoining: the neighbours' average or one neighbour's copy\n\n"
        f"On {s['join_topology']}, peer {joiner} leaves at step {s['leave_step']} and rejoins at "
        f"step {s['join_step']} (`churn: leave:{joiner}@{s['leave_step']},join:{joiner}@"
        f"{s['join_step']}`); it is handed model, momentum and step counter as the mean of its "
        "surviving neighbours' (`churn_join: average`) or as the lowest-id neighbour's copy "
        "(`copy`); its own stale model is dropped either way. The shift at the join is the "
        "library's `average_shift_total` between the evaluations around the join; the joiner's "
        f"accuracy and squared distance to the members' average are taken at the evaluations "
        f"after the join (every epoch, {spe} steps apart; the first one step after it), next to "
        "the other members' (their accuracies' mean, min and max; their mean squared distance). "
        "'Joiner ≥ others' min': in how many seeds the joiner's accuracy is at least the lowest "
        "of the others' (within their spread, or above it: caught up). The final accuracy "
        "stands next to the same algorithm's no-churn row of the grid (same topology and "
        "recipe).\n\n"
        + "\n".join(join_verdict(joins))
        + "\n\n"
        + join_table(joins, cells, s["join_topology"])
        + "\n"
    )


def limits_text(cells, soaked: bool = False) -> str:
    still = [c["acc_avg"] for (_, _, rate), c in cells.items() if rate == 0.0]
    level = (
        f"the no-churn rows' averaged models reach {100 * min(still):.1f}–{100 * max(still):.1f} "
        "% test accuracy (10 classes)"
        if still
        else "no no-churn rows yet"
    )
    return (
        "## Limits\n\n"
        "- The grid and the rejoin runs are in-process: every peer is a thread of one process "
        "(backend local), and every "
        "change comes from the schedule, so a leaving peer always finishes its step first and "
        "takes part in measuring the shift. Nothing here is a crash, a stopped process or a cut "
        "link: no detection, no step in flight lost, no transport timeout is exercised, and the "
        "figures say nothing about wall-clock cost of a change.\n"
        + (
            "- Real kills, stops, cuts and restarts are in the soak below (torch backend, one "
            "process per host), on a small problem, not on this recipe.\n"
            if soaked
            else "- The emulated-cluster soak (torch backend, one process per host, real kills, "
            "stops, cuts and restarts) is not in these rows.\n"
        )
        + f"- One recipe, short: {level}, a small CNN after a few hundred steps, far from "
        "converged (training.md: 90.9 % with the full-width cnn1d, 8 peers, 60 epochs). "
        "The churn figures compare runs of equal length on this recipe, nothing more; what "
        "churn costs a converged model is not measured here.\n"
        "- The shift is measured for cooperative changes (a departed peer's model is known at "
        "its last step); under detected losses the library measures none.\n\n"
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
