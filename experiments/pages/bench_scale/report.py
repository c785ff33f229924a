"""The scaling benchmark's page: per-point tables, the two reductions side by side, the in-process
simulation at scale, and growth rates fitted on log-log axes (page.md and parts.md beside this)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.pages._markdown import fill, snippets, table, table_rows, template

PARTS = snippets(__file__, "parts.md")
#: What a point times: four algorithms (one `step()` each); also two reductions of one flat tensor.
ALGORITHMS = ("exact", "powergossip", "allreduce", "powersgd")
LABELS = dict(exact="exact gossip", powergossip="PowerGossip r1", allreduce="all-reduce")
LABELS.update(powersgd="PowerSGD r1", ring="ring all-reduce", gather="all-gather reduction")
BACKENDS = ("local", "mpi", "torch")  # in the page's order; parts.md names each


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


def fmt_bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def fmt_seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def slope(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Least-squares exponent a of y ∝ x^a (None with fewer than two positive points)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else None


def _ok(records, section, backend=None):
    """The measured points of a section (and backend)."""
    return [
        r
        for r in records
        if "ranks" in r
        and r["point"]["section"] == section
        and backend in (None, r["point"]["backend"])
    ]


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


def render_markdown(
    records: List[Dict[str, Any]], header: str, notes: Sequence[str], title: str = ""
) -> str:
    """The page (page.md beside this file); `notes`: what the plan left out."""
    size = _ok(records, "size")
    size_name = lambda r: f"ring:{r['point']['peers']}, N = {r['ranks'][0]['numel']:,}"  # noqa: E731
    return fill(
        template(__file__),
        title=title,
        header=header,
        peer_tables=_peer_tables(records),
        reductions=_reductions(records),
        simulation=_simulation(records),
        size=[*PARTS["size"].split("\n"), "", *cost_table(size, size_name)] if size else [],
        growth=_growth(records, size, notes),
    )


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
                bytes_, seconds = (
                    gather["received"] / ring["received"],
                    gather["seconds"] / ring["seconds"],
                )
                cells += [fmt_seconds(gather["seconds"]), fmt_bytes(gather["received"])]
                cells.append(f"{bytes_:.3g}×, {seconds:.3g}×")
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
