"""consensus.md: the page's text from its instances (the dicts `render` rebuilds from the rows)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Dict, List, Sequence

from experiments.pages._markdown import fill, grid_end, snippets, table
from gossip_powersgd.consensus_problems import problem_shapes
from gossip_powersgd.metrics import DIVERGE_FACTOR, FLOOR_MARGIN, FLOOR_ULPS

from .files import CURVES, budget_name, column_title, columns, family, fmt_gamma
from .files import format_table, winner_cell, winner_text
from .instance import FULL_GRID, SAVED_EPOCHS, TRAINING


#: The page's fixed text (page.md beside this file): the page, and an instance's section.
TEXT = snippets(__file__, "page.md")


def page(instances: Sequence[Dict], made_by: str, meta: Dict) -> str:
    """The page (its fixed text: page.md beside this file); `meta`: seconds (running time),
    cpu_count, machine, from the rows."""
    counts = Counter(r["commit"] for r in instances)
    commits = (
        f"commit {next(iter(counts))}"
        if len(counts) == 1
        else "commits " + ", ".join(f"{c} ({n} instance{'s' * (n > 1)})" for c, n in counts.items())
    )
    fields = dict(meta, **{key: TRAINING[key] for key in ("lr", "momentum", "batch_size")})
    fields.update(made_by=made_by + "  ", date=max(r["finished"] for r in instances))  # "  ": <br>
    fields.update(commits=commits, minutes=meta["seconds"] / 60, count=len(instances))
    fields.update(partition=TRAINING["partition"].replace(":", "(") + ")")
    fields.update(saved=", ".join(map(str, SAVED_EPOCHS)), floor_ulps=FLOOR_ULPS)
    fields.update(floor_margin=FLOOR_MARGIN, diverge=DIVERGE_FACTOR, **method_fields(instances))
    return fill(
        TEXT["page"],
        **fields,
        winner_map=winner_map(instances),
        instances=[line for r in instances for line in instance_lines(r)],
    )


def instance_lines(r: Dict) -> List[str]:
    """One instance's section: its setting, seed 0's table, the headline, plots and files."""
    shapes = problem_shapes(r["problem"])
    seed0 = [x for x in r["results"] if x["seed"] == 0 and not x["swept"]]
    fields = dict(r, tensors=len(shapes), floats=sum(math.prod(s) for s in shapes), curves=CURVES)
    fields.update(topk=f" · top-k ratio {r['topk_ratio']:g}" if r["topk_ratio"] else "")
    fields.update(seed_list=", ".join(map(str, r["seeds"])), runs=len(r["results"]))
    fields.update(steps=", ".join(f"{x['label']}: {x['steps']} ({x['stop']})" for x in seed0))
    table = format_table(r["summary"], r["budgets"])
    text = fill(
        TEXT["instance"], **fields, table=table, headline=headline(r), edge_notes=edge_notes(r)
    )
    return text.split("\n") + [""]


def method_fields(instances: Sequence[Dict]) -> Dict[str, Any]:
    """What the method paragraphs say of this run: scope, dtypes, stops, γ grids."""
    first, screen = instances[0], budget_name(instances[0]["screen_bits"])
    grids = sorted({tuple(r["gammas"]) for r in instances})
    by_topology: Dict[str, List[str]] = {}
    for r in instances:
        by_topology.setdefault(r["topology"], []).append(r["problem"])
    fields = dict(scope=_listing(by_topology), missing=_listing(not_run(by_topology)))
    fields.update(dtypes=", ".join(sorted({r["dtype"] for r in instances})))
    fields.update(stop_relative=first["stop_relative"], max_bits=budget_name(first["max_bits"]))
    fields.update(grids="; ".join("{" + ", ".join(map(fmt_gamma, grid)) + "}" for grid in grids))
    return dict(fields, screen=screen, finalists=first["finalists"])


def _listing(problems: Dict[str, List[str]]) -> str:
    """ "ring:8: `matrix`, `cnn`; torus:4x4: nothing" from problems by topology."""
    return "; ".join(
        f"{t}: " + (", ".join(f"`{p}`" for p in ps) or "nothing") for t, ps in problems.items()
    )


def not_run(ran: Dict[str, List[str]]) -> Dict[str, List[str]]:
    """Per topology of `ran` (the problems run, by topology), the problems of the full grid it has
    no instance of (the trained models exist for ring:8 only)."""
    return {
        t: [p for p in FULL_GRID if p not in ps and (t == "ring:8" or not p.startswith("models:"))]
        for t, ps in ran.items()
    }


def winner_map(instances: Sequence[Dict]) -> List[str]:
    cols = columns(instances[0]["budgets"])
    header = ["topology", "problem", "seeds"] + [column_title(*column) for column in cols]
    rows = [
        [r["topology"], r["problem"], str(len(r["seeds"]))]
        + [winner_text(winner_cell(r, kind, key)) for kind, key in cols]
        for r in instances
    ]
    return table(header, rows) + ["![PowerGossip ÷ best baseline](consensus/winner_map.png)", ""]


def _ratio_text(pg: Dict, other: Dict) -> str:
    """'PowerGossip's error is k× lower/higher' at matched bits, with bounds and floors."""
    a, b = pg["row"], other["row"]
    if a["at_floor"] and b["at_floor"]:
        return "both at the precision floor"
    if a["bound"] and b["bound"]:
        return "both stopped earlier below the stopping error"
    lower = a["relative"] < b["relative"]
    factor = b["relative"] / a["relative"] if lower else a["relative"] / b["relative"]
    # An upper bound on the smaller error makes the factor a lower bound, on the larger undefined.
    small, large = (a, b) if lower else (b, a)
    prefix = "≥ " if small["bound"] else ("≤ " if large["bound"] else "")
    text = f"PowerGossip's error is {prefix}{factor:.3g}× {'lower' if lower else 'higher'}"
    floor = [name for name, row in (("PowerGossip", a), ("the other", b)) if row["at_floor"]]
    return text + (f" ({' and '.join(floor)} at precision floor)" if floor else "")


#: What each headline compares the best PowerGossip with: (name, its families' test).
VERSUS = (
    ("exact gossip", lambda f: f[0] == "exact"),
    ("best tuned baseline", lambda f: f[1] == "tuned"),
    ("best top-k / low-rank baseline", lambda f: f[1] == "tuned" and f[2] in ("topk", "lowrank")),
)


def headline(instance: Dict) -> List[str]:
    """At each budget (seed 0): the best PowerGossip against exact gossip, the best tuned
    baseline, and the best baseline whose compressor has PowerGossip's float count."""
    summary, lines = instance["summary"], []
    families = {label: family(entry) for label, entry in summary.items()}
    for budget in instance["budgets"]:
        ok = [(k, e["budgets"][budget]) for k, e in summary.items()]
        ok = [(k, cell) for k, cell in ok if cell["status"] == "ok"]

        def best(pick):
            found = [(k, cell) for k, cell in ok if pick(families[k])]
            return min(found, key=lambda c: c[1]["row"]["relative"], default=None)

        pg = best(lambda f: f[0] == "powergossip")
        if pg is None:
            continue
        parts = [f"best PowerGossip ({pg[0]}) {pg[1]['row']['relative']:.3g}"]
        verdicts = []
        for name, found in ((name, best(pick)) for name, pick in VERSUS):
            if found is None:
                continue
            tuned = found[1].get("gamma") is not None and families[found[0]][1] == "tuned"
            gamma = f", γ={fmt_gamma(found[1]['gamma'])}" if tuned else ""
            label = "exact gossip" if name == "exact gossip" else f"{name} ({found[0]}{gamma})"
            parts.append(f"{label} {found[1]['row']['relative']:.3g}")
            verdicts.append(f"vs {name}: {_ratio_text(pg[1], found[1])}")
        head = f"- at {budget_name(budget)} bits per peer (relative errors): "
        lines.append(head + " · ".join(parts) + ". " + "; ".join(verdicts) + ".")
    return lines


def edge_notes(instance: Dict) -> List[str]:
    """Swept algorithms whose best γ at the largest budget is an end of the grid."""
    grid, last, lines = instance["gammas"], instance["budgets"][-1], []
    for label, entry in instance["summary"].items():
        cell = entry["budgets"][last]
        side = entry["swept"] and cell["status"] == "ok" and grid_end(cell["gamma"], grid)
        if side:
            budget, gamma = budget_name(last), fmt_gamma(cell["gamma"])
            lines.append(fill(TEXT["edge"], label=label, budget=budget, side=side, gamma=gamma))
    return lines
