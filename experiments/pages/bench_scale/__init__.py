"""`python -m experiments bench_scale`: cost vs number of peers and vs model size of exact gossip,
PowerGossip r1, all-reduce and PowerSGD r1; the ring all-reduce vs the all-gather reduction. Each
point runs in a fresh child (`measure.py`), so a crash costs one point; to measure a point again,
delete its line from bench_scale.jsonl and run the page."""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import compact, header, on_machine, python_child, quick_mark
from experiments.pages._bench import run_child

from .report import ALGORITHMS, PARTS, label, render_markdown

KINDS = ALGORITHMS + ("ring", "gather")
#: The all-gather reduction holds n copies of the tensor on each of n peers; in one process that is
#: n^2 copies, so in-process points above this many gathered bytes skip it (and say so).
GATHER_BUDGET_BYTES = 2 * 2**30
TIMEOUT = {False: 420.0, True: 300.0}  #: seconds per point


def points(quick: bool) -> List[Dict[str, Any]]:
    """Every point (section, backend, peers, params, steps, kinds), in the page's order: "peers"
    (cost vs n) and "size" (cost vs model size); --quick: a few seconds of the same. In-process,
    ring:256 leaves out the reductions table's ring and all-gather (PARTS["big point"])."""
    if quick:
        out = [("peers", "local", n, "1e3", 2, KINDS) for n in (2, 4)]
        out += [("size", "local", 2, p, 2, KINDS) for p in ("1e3", "1e4")]
    else:
        out = [
            ("peers", "local", n, "resnet20", 4 if n <= 64 else 2, KINDS)
            for n in (8, 16, 32, 64, 128)
        ]
        out.append(("peers", "local", 256, "resnet20", 2, ALGORITHMS))
        for backend in ("mpi", "torch"):
            out += [("peers", backend, n, "resnet20", 4, KINDS) for n in (2, 4, 8, 16)]
        out += [("size", "local", 4, p, 4, KINDS) for p in ("1e4", "1e5", "1e6", "1e7")]
        out += [("size", "local", 2, "1e7", 4, KINDS), ("size", "local", 2, "1e8", 2, KINDS)]
    names = ("section", "backend", "peers", "params", "steps", "kinds")
    return [with_gather_rule(dict(zip(names, p), kinds=list(p[5]))) for p in out]


def tensor_bytes(params: str) -> int:
    """float32 bytes of one peer's parameters in the set `params`."""
    from .measure import parameter_shapes

    return 4 * sum(math.prod(shape) for _, shape in parameter_shapes(params))


def with_gather_rule(point: Dict[str, Any]) -> Dict[str, Any]:
    """Drop the all-gather reduction from an in-process point whose n^2 copies exceed the budget."""
    if point["backend"] != "local" or "gather" not in point["kinds"]:
        return point
    if point["peers"] ** 2 * tensor_bytes(point["params"]) <= GATHER_BUDGET_BYTES:
        return point
    return dict(point, kinds=[k for k in point["kinds"] if k != "gather"])


def notes(records: List[Dict[str, Any]]) -> List[str]:
    """What the plan left out of the measured points (the gathered bytes: the point's own)."""
    out = []
    for r in records:
        p = r["point"]
        if "ring" not in p["kinds"]:
            out.append(f"{label(p)}: {PARTS['big point']}")
        elif "gather" not in p["kinds"]:
            size = 4 * r["ranks"][0]["numel"] if "ranks" in r else tensor_bytes(p["params"])
            budget = GATHER_BUDGET_BYTES >> 30
            out.append(
                PARTS["gather skipped"].format(label=label(p), mb=size / 1e6, budget=budget, **p)
            )
    return sorted(out)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    return [
        Run(
            key=f"{p['section']}/{p['backend']}/ring:{p['peers']}/{p['params']}",
            config=dict(p, timeout=TIMEOUT[quick]),
            cost=p["peers"] * p["steps"],
        )
        for p in points(quick)
    ]


@on_machine
def row(run: Run) -> Dict[str, Any]:
    """The point in its child: every rank's record (floats to 5 digits), or why it failed."""
    point = {k: v for k, v in run.config.items() if k != "timeout"}
    with tempfile.TemporaryDirectory(prefix="bench_scale-") as folder:
        module, args = "experiments.pages.bench_scale.measure", [json.dumps(point), folder]
        command = python_child(module, args, point["backend"], point["peers"])
        started = time.perf_counter()
        status, err = run_child(command, run.config["timeout"])
        record: Dict[str, Any] = {"point": point, "wall": time.perf_counter() - started}
        files = sorted(Path(folder).glob("rank-*.json"), key=lambda f: int(f.stem.split("-")[1]))
        if status is None:
            record = {"point": point, "error": err}
        elif status != 0 or len(files) != point["peers"]:
            lines = [line for line in err.strip().splitlines() if line.strip()] or ["(no output)"]
            record["error"] = f"exit {status}: {lines[-1][:300]}"
        else:
            record["ranks"] = [json.loads(f.read_text()) for f in files]
    return compact(record, columns=False)


def render(rows: Rows) -> Outputs:
    """The page (report.py)."""
    records = [r.row for r in rows.records]
    page = render_markdown(records, header(rows), notes(records), quick_mark(rows))
    return {"bench_scale.md": page}


TITLE = "cost vs peers (in-process to 256, MPI, torch) and vs model size, four algorithms"
PAGE = register(Page("bench_scale", TITLE, plan, row, render, serial=True))
