"""`python -m experiments bench_scale`: cost vs number of peers and vs model size of exact gossip,
PowerGossip r1, all-reduce and PowerSGD r1; the ring all-reduce vs the all-gather reduction; growth
rates fitted on log-log axes. Each point runs in a fresh child (`measure.py`), so a crash costs one
point; to measure a point again, delete its line from bench_scale.jsonl and run the page."""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import compact, count_params, fmt_bytes, header, on_machine
from experiments.pages._bench import python_child
from experiments.pages._bench import quick_mark, run_child
from experiments.pages._markdown import fill, snippets, table, table_rows, template

PARTS = snippets(__file__, "parts.md")
#: What a point times: four algorithms (one `step()` each); also two reductions of one flat tensor.
ALGORITHMS = ("exact", "powergossip", "allreduce", "powersgd")
LABELS = dict(exact="exact gossip", powergossip="PowerGossip r1", allreduce="all-reduce")
LABELS.update(powersgd="PowerSGD r1", ring="ring all-reduce", gather="all-gather reduction")
BACKENDS = ("local", "mpi", "torch")  # in the page's order; parts.md names each

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

    return 4 * count_params(parameter_shapes(params))


def with_gather_rule(point: Dict[str, Any]) -> Dict[str, Any]:
    """Drop the all-gather reduction from an in-process point whose n^2 copies exceed the budget."""
    gathered = point["peers"] ** 2 * tensor_bytes(point["params"])
    if point["backend"] != "local" or gathered <= GATHER_BUDGET_BYTES:
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
            mb = (4 * r["ranks"][0]["numel"] if "ranks" in r else tensor_bytes(p["params"])) / 1e6
            budget = GATHER_BUDGET_BYTES >> 30
            out.append(PARTS["gather skipped"].format(label=label(p), mb=mb, budget=budget, **p))
    return sorted(out)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    key = "{section}/{backend}/ring:{peers}/{params}"
    return [
        Run(key.format(**p), dict(p, timeout=TIMEOUT[quick]), cost=p["peers"] * p["steps"])
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


def mode(record: Dict[str, Any]) -> str:
    """The mark of an in-process point whose threads took turns (`LocalCluster(cooperative=...)`)."""
    return " ‡" if record["ranks"][0].get("takes_turns") else ""


def summarize(record: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """kind -> time per step (slowest peer), mean bytes sent / received per rank, and memory (the
    one process's RSS in-process, the sum over rank processes otherwise)."""
    one_process = record["point"]["backend"] == "local"
    out: Dict[str, Dict[str, float]] = {}
    for k, first in enumerate(record["ranks"][0]["results"]):
        rows = [rank["results"][k] for rank in record["ranks"]]
        rss = [r["rss"] for r in rows]
        out[first["kind"]] = {
            "seconds": max(r["seconds_per_step"] for r in rows),
            "sent": sum(r["bytes_sent"] for r in rows) / len(rows),
            "received": sum(r["bytes_received"] for r in rows) / len(rows),
            "rss": max(rss) if one_process else sum(rss),
        }
    return out


def fmt_seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def slope(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Least-squares exponent a of y ∝ x^a (None without two distinct positive x)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    return statistics.linear_regression(*zip(*pts)).slope if len(dict(pts)) > 1 else None


def _ok(records, section, backend=None):
    """The measured points of a section (and backend)."""
    ok = [r for r in records if "ranks" in r and r["point"]["section"] == section]
    return [r for r in ok if backend in (None, r["point"]["backend"])]


def cost_table(records: List[Dict[str, Any]], name) -> List[str]:
    """Time per step and bytes sent per rank of the four algorithms, a line a record (`name`: its
    first cell), then the turn-taking note where a point took turns."""
    head = " | ".join(f"{LABELS[k]}: time / step | sent / rank" for k in ALGORITHMS)
    lines = [f"| | {head} |", "|---|" + "---|---|" * len(ALGORITHMS)]
    for r in records:
        s = summarize(r)
        cells = [
            f"{fmt_seconds(s[k]['seconds'])} | {fmt_bytes(s[k]['sent'])}" if k in s else "– | –"
            for k in ALGORITHMS
        ]
        lines.append(f"| {name(r)}{mode(r)} | " + " | ".join(cells) + " |")
    return lines + [""] + ([PARTS["turns"], ""] if any(mode(r) for r in records) else [])


def growth_table(series: Dict[str, List[Tuple[float, Dict]]], kinds, what: str) -> List[str]:
    """The exponents of time and bytes sent against `what`, a line a series."""
    rows = []
    for name, points in series.items():
        cells = [name]
        for k in kinds:
            t, b = (slope([(x, s[k][y]) for x, s in points if k in s]) for y in ("seconds", "sent"))
            cells.append(", ".join(f"{what}^{'–' if e is None else f'{e:+.2f}'}" for e in (t, b)))
        rows.append(cells)
    return table(["series"] + [f"{LABELS[k]}: time, bytes" for k in kinds], rows, None)


def _peer_tables(records: List[Dict[str, Any]]) -> List[str]:
    """Cost vs number of peers, one table per transport."""
    out: List[str] = []
    if peers := _ok(records, "peers"):
        first = peers[0]
        out += PARTS["peers"].format(numel=first["ranks"][0]["numel"], **first["point"]).split("\n")
        out.append("")
    for backend in BACKENDS:
        if recs := _ok(records, "peers", backend):
            out += [f"### {PARTS[backend]}", ""]
            out += cost_table(recs, lambda r: f"n = {r['point']['peers']}")
    return out


def _reductions(records: List[Dict[str, Any]]) -> List[str]:
    """The ring all-reduce next to the all-gather reduction (its time, bytes, both against the ring's)."""
    rows = []
    for r in _ok(records, "peers"):
        if ring := (s := summarize(r)).get("ring"):
            cells = [r["point"]["backend"], str(r["point"]["peers"])]
            cells += [fmt_seconds(ring["seconds"]), fmt_bytes(ring["received"])]
            if gather := s.get("gather"):
                cells += [fmt_seconds(gather["seconds"]), fmt_bytes(gather["received"])]
                ratios = (gather[k] / ring[k] for k in ("received", "seconds"))
                cells.append(", ".join(f"{x:.3g}×" for x in ratios))
            rows.append(cells if gather else [*cells, "skipped", "–", "–"])
    return [*table_rows(rows), ""]


def _simulation(records: List[Dict[str, Any]]) -> List[str]:
    """PowerGossip on the in-process points: time and memory."""
    rows = []
    for r in _ok(records, "peers", "local"):
        if s := summarize(r).get("powergossip"):
            n = r["point"]["peers"]
            rows.append([f"{n}{mode(r)}", fmt_seconds(s["seconds"]), f"{1 / s['seconds']:.3g}"])
            rows[-1] += [fmt_bytes(s["rss"]), fmt_bytes(s["rss"] / n)]
            rows[-1].append(fmt_bytes(r["ranks"][0]["rss_peak"]))
    return [*PARTS["simulation"].split("\n"), *table_rows(rows), ""] if rows else []


def _growth(
    records: List[Dict[str, Any]], size_recs: List[Dict[str, Any]], notes: Sequence[str]
) -> List[str]:
    """The growth exponents, and what was skipped or failed."""
    out: List[str] = []
    # ring:2 has one neighbour, ring:n>2 two: fitting across that step would fake a growth in n.
    series = {
        f"vs n, {b}": [(r["point"]["peers"], summarize(r)) for r in recs if r["point"]["peers"] > 2]
        for b in BACKENDS
        if (recs := _ok(records, "peers", b))
    }
    if series:
        table_ = growth_table(series, (*ALGORITHMS, "ring", "gather"), "n")
        out += [*PARTS["growth"].split("\n"), "", *table_, ""]
    sizes: Dict[str, list] = {}
    for r in size_recs:
        point = (r["ranks"][0]["numel"], summarize(r))
        sizes.setdefault(f"vs N, ring:{r['point']['peers']}", []).append(point)
    if sizes:
        out += growth_table(sizes, ALGORITHMS, "N") + [""]
    failed = [f"{label(r['point'])}: failed: {r['error']}" for r in records if "error" in r]
    if notes := [*notes, *failed]:
        out += ["## Skipped or failed", ""] + [f"* {n}" for n in notes] + [""]
    return out


def label(p: Dict[str, Any]) -> str:
    """A point's name in the notes."""
    return f"{p['section']}: {p['backend']} ring:{p['peers']} {p['params']}"


def render(rows: Rows) -> Outputs:
    """The page: page.md beside this file, with parts.md's pieces where the rows call for them."""
    records = [r.row for r in rows.records]
    size = _ok(records, "size")
    size_name = lambda r: f"ring:{r['point']['peers']}, N = {r['ranks'][0]['numel']:,}"  # noqa: E731
    page = fill(
        template(__file__),
        title=quick_mark(rows),
        header=header(rows),
        peer_tables=_peer_tables(records),
        reductions=_reductions(records),
        simulation=_simulation(records),
        size=[*PARTS["size"].split("\n"), "", *cost_table(size, size_name)] if size else [],
        growth=_growth(records, size, notes(records)),
    )
    return {"bench_scale.md": page}


TITLE = "cost vs peers (in-process to 256, MPI, torch) and vs model size, four algorithms"
PAGE = register(Page("bench_scale", TITLE, plan, row, render, serial=True))
