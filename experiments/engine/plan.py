"""What a page is to the engine: its plan (a list of `Run`s), its row function and its renderer.

A page module builds one `Page` and registers it (`experiments.pages.register`). The engine runs
the plan's missing runs (`row(run)` each, in worker processes with --jobs), stores each row as a
line of PAGE.jsonl, and hands the rows, in plan order, to `render`, which returns the page's files.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Mapping, Union

#: What a renderer returns: file name (relative to --out) -> its text or bytes.
Outputs = Dict[str, Union[str, bytes]]


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a plan.

    key: unique in the plan; the row is stored and resumed under it (readable: "iid/exact/seed0").
    config: what `row` needs to make the row (JSON-able: dicts, lists, str, numbers, None), e.g. a
        `gossip_powersgd.run` config and the page's labels. A stored row is reused only if it was
        made from the same config and seed (else the sweep stops and says which).
    seed: the run's seed (part of its identity, like the config).
    cost: a relative cost estimate; --jobs starts the costliest runs first.
    """

    key: str
    config: Mapping[str, Any]
    seed: int = 0
    cost: float = 1.0

    def identity(self) -> Dict[str, Any]:
        """{"config", "seed"} as a stored row holds them (JSON round trip: tuples are lists)."""
        return json.loads(json.dumps({"config": dict(self.config), "seed": self.seed}))


@dataclasses.dataclass(frozen=True)
class Page:
    """A results page.

    name: the CLI's PAGE (`python -m experiments NAME`); the rows go to NAME.jsonl.
    title: one line for `python -m experiments --list`.
    plan: plan(quick, rows) -> the runs, in the page's order. `rows` maps the keys of the rows
        made so far to their row dicts, so a plan may depend on earlier rows (a γ chosen by a
        sweep); the engine calls it again after each wave of runs until every planned run has a
        row. A plan that depends on nothing ignores `rows`. It must be cheap (no training).
    row: row(run) -> a JSON-able dict: one run's numbers. A module-level function (worker
        processes import it by name). Runs in a fresh process with --jobs > 1.
    render: render(rows: `experiments.engine.Rows`) -> {file name: text or bytes}: the page, its
        CSV/JSON and plots, from the rows alone (no training, no clock, no git: the same rows give
        the same bytes).
    serial: its rows are timings: the runs are made one at a time whatever --jobs says (two runs
        at once would share the cores they time).
    """

    name: str
    title: str
    plan: Callable[[bool, Mapping[str, Dict[str, Any]]], List[Run]]
    row: Callable[[Run], Dict[str, Any]]
    render: Callable[[Any], Outputs]
    serial: bool = False


def checked_plan(page: Page, quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """`page.plan(quick, rows)`, refusing a key planned twice or a run that is not a `Run`."""
    runs = list(page.plan(quick, rows))
    seen = set()
    for run in runs:
        if not isinstance(run, Run):
            raise TypeError(f"page {page.name}: its plan gave {type(run).__name__}, not a Run")
        if run.key in seen:
            raise ValueError(
                f"page {page.name}: the plan has run {run.key!r} twice: give each run its own key"
            )
        seen.add(run.key)
    return runs
