"""Pages for the engine's tests (tests/experiments/engine/): rows without training (each a
function of its run), a log of every row started (ENGINE_TEST_LOG: one key per line), and a run
that kills its own process (ENGINE_TEST_KILL: that run's key) or the process that started it
(ENGINE_TEST_KILL_PARENT: the sweep, from a worker, once the rows file ENGINE_TEST_ROWS holds the
rows of the keys in ENGINE_TEST_WAIT_FOR, or after a minute), for the resume and pool tests."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run

#: (cost, seconds) of each run: the two costly ones are last in the plan and take longest.
SHAPE = [(1.0, 0.0), (1.0, 0.0), (1.0, 0.0), (5.0, 0.4), (5.0, 0.4)]


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    shape = SHAPE[:3] if quick else SHAPE
    return [
        Run(f"k{i}", {"i": i, "pause": pause}, seed=10 + i, cost=cost)
        for i, (cost, pause) in enumerate(shape)
    ]


def row(run: Run) -> Dict[str, Any]:
    log = os.environ.get("ENGINE_TEST_LOG")
    if log:
        with open(log, "a") as f:
            f.write(run.key + "\n")
    if os.environ.get("ENGINE_TEST_KILL") == run.key:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("ENGINE_TEST_KILL_PARENT") == run.key:
        _wait_for_rows(
            os.environ["ENGINE_TEST_ROWS"], os.environ["ENGINE_TEST_WAIT_FOR"].split(",")
        )
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(run.config["pause"])
    i = run.config["i"]
    return {"i": i, "square": i * i, "seed": run.seed, "pid": os.getpid()}


def _wait_for_rows(path: str, keys: List[str], seconds: float = 60.0) -> None:
    """Until the rows file holds a line for every key of `keys` (at most `seconds`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                stored = {json.loads(line)["key"] for line in f if line.strip()}
            if set(keys) <= stored:
                return
        time.sleep(0.05)


def render(rows: Rows) -> Outputs:
    lines = [f"{r['i']} {r['square']}" for r in rows.data]
    done = "" if rows.complete else f"partial: {len(rows.records)} of {rows.planned}\n"
    return {
        "engine-test.md": done + "\n".join(lines) + "\n",
        "engine-test.json": json.dumps([r.key for r in rows.records]) + "\n",
    }


PAGE = Page("engine-test", "a page for the engine's tests", plan, row, render)


def registry() -> Dict[str, Page]:
    return {PAGE.name: PAGE}
