"""Rows of runs that survive an interruption: the plumbing `dp_budget` and `dp_subspace` share.

A page's rows are keyed by a string; every finished row is written at once to
``STEM.partial.json`` under the page's directory (atomically), and a rerun of the same command
runs only the rows that file, or the finished ``STEM.json``, does not hold yet. Runs go
`jobs` at a time in worker processes (the engine's pool, `experiments.engine.pool`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, Sequence, Tuple

from experiments.engine.pool import run_pool
from gossip_powersgd.utils import atomic_write

Rows = Dict[str, Dict[str, Any]]


class Progress:
    """The rows of `stem` under `out` so far, and the wall seconds their runs took.

    ``rows`` and ``seconds`` come from the partial file if there is one, else from the finished
    page's JSON (a plan that grew runs only its new rows); a file without seconds counts its
    runs' seconds divided by `jobs`.
    """

    def __init__(self, out: Path, stem: str, jobs: int):
        self.partial = out / f"{stem}.partial.json"
        self.final = out / f"{stem}.json"
        source = (
            self.partial if self.partial.exists() else self.final if self.final.exists() else None
        )
        loaded = json.loads(source.read_text()) if source is not None else {}
        self.rows: Rows = loaded.get("rows", {})
        self.previous = loaded.get(
            "seconds", sum(r.get("run_seconds", 0) for r in self.rows.values()) / jobs
        )
        self._started = time.perf_counter()

    def seconds(self, ran: bool = True) -> float:
        """Wall seconds of the runs so far (this invocation's included when it `ran`)."""
        return self.previous + (time.perf_counter() - self._started if ran else 0.0)

    def save(self, rows: Rows) -> None:
        """Write the rows so far to the partial file (atomic)."""
        atomic_write(self.partial, json.dumps(dict(rows=rows, seconds=self.seconds()), indent=1))

    def finish(self, complete: bool) -> None:
        """Drop the partial file once the finished JSON holds every row."""
        if complete and self.partial.exists():
            self.partial.unlink()


def run_missing(
    todo: Sequence[Tuple[str, tuple]],
    run: Callable[..., Dict[str, Any]],
    jobs: int,
    done: Rows,
    save: Callable[[Rows], None] = None,
) -> None:
    """``done[key] = run(*args)`` for every (key, args) of `todo`, `jobs` processes at a time
    (`experiments.engine.pool.run_pool`), calling `save(done)` after each."""

    def finished(index: int, row: Dict[str, Any]) -> None:
        done[todo[index][0]] = row
        if save is not None:
            save(done)

    run_pool(run, [args for _, args in todo], max(1, jobs), done=finished)
