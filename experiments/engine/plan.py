"""What a page is to the engine: its plan (a list of `Run`s), its row function and its renderer
(see the package's docstring)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Mapping, Union

#: What a renderer returns: file name (relative to --out) -> its text or bytes.
Outputs = Dict[str, Union[str, bytes]]


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a plan. key: unique in the plan, the row is stored and resumed under it
    ("iid/exact/seed0"); config: what `row` needs (JSON-able); a stored row is reused only if made
    from the same config and seed; cost: relative, --jobs starts the costliest runs first."""

    key: str
    config: Mapping[str, Any]
    seed: int = 0
    cost: float = 1.0

    def identity(self) -> Dict[str, Any]:
        """{"config", "seed"} as a stored row holds them (JSON round trip: tuples are lists)."""
        return json.loads(json.dumps({"config": dict(self.config), "seed": self.seed}))


@dataclasses.dataclass(frozen=True)
class Page:
    """A results page: `python -m experiments NAME` (rows in NAME.jsonl); `title`: its line in
    --list. plan(quick, rows) -> the runs in page order, cheap; `rows` ({key: row} made so far)
    lets a plan depend on earlier rows: it is called again after each wave until every run has a
    row. row(run) -> a JSON-able dict (module-level: workers import it by name). render(`Rows`) ->
    {file name: text or bytes}, from the rows alone: the same rows give the same bytes. serial:
    the rows are timings, made one at a time whatever --jobs says."""

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
