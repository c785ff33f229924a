"""The benchmark's page: targets, findings, per-setting tables, the isolated-peer and kernel tables,
all rendered from the summaries (and the kernel records, looked up by their `key`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments.pages._bench import MODELS, count_params, model_shapes
from experiments.pages._bench import median as _median
from experiments.pages._markdown import columns, fill, table, table_rows, template

from .verdicts import _mb, _ms, _pct, _span, _x, _yes, findings, kernel_prediction, targets

#: A setting's table, a row a line: (label, exact gossip's cell, a PowerGossip variant's cell).
BYTE_ROWS = (
    ("bytes / peer / step (transport counters)", lambda e: _mb(e["bytes"]), "bytes"),
    ("… right / left half-step", lambda e: "–", "halves"),
    ("counters = `bytes_per_step()` every step", lambda e: _yes(e["bytes_match"]), "match"),
    ("bytes ratio exact / PowerGossip", lambda e: "1", "ratio"),
)
VARIANT_CELLS = {
    "bytes": lambda v: _mb(v["bytes"]),
    "halves": lambda v: f"{_mb(v['bytes_right'])} / {_mb(v['bytes_left'])}",
    "match": lambda v: _yes(v["bytes_match"]),
    "ratio": lambda v: f"**{v['bytes_ratio']:.0f}×**",
}
TIMES = (
    ("total", "time / step (ms)"),
    ("compute", "… compute (ms)"),
    ("comm", "… communication (ms)"),
)
#: Ratios shown in the batched column only: (summary key, label, cell).
RATIOS = (
    ("speedup", "naive / batched: compute, step time", lambda r: _x(r["compute"], r["total"])),
    ("before", "this tree / `{}`: compute, step time", lambda r: _x(**r["ratio"])),
)


def _variant_label(s: Dict[str, Any], name: str) -> str:
    if name == "before":
        return f"PowerGossip r=1 batched, `{s['before']['commit']}`"
    return f"PowerGossip r=1 {name}"


def render_setting(s: Dict[str, Any]) -> List[str]:
    names = list(s["variants"])
    ex, vs = s["exact"], [s["variants"][n] for n in names]
    timing = "bytes only (2 steps)."
    if not s["bytes_only"]:
        warm = " after a warm-up step" if s["exact_warmup"] else " (its first, no warm-up)"
        timing = (
            f"{s['reps']} interleaved blocks of {s['block_steps']} steps per variant; exact "
            f"gossip timed over {s['exact_steps']} step(s){warm}; {s['seconds']:.0f} s."
        )
    rows = [[label, cell(ex), *map(VARIANT_CELLS[v], vs)] for label, cell, v in BYTE_ROWS]
    if not s["bytes_only"]:
        rows += [[label, _ms(ex.get(key)), *(_ms(v[key]) for v in vs)] for key, label in TIMES]
        bw = f"compute efficiency in situ (vs {s['bandwidth_concurrent']:.2f} GB/s per peer, all copying)"
        rows.append([bw, "–", *(_pct(v.get("efficiency_in_situ")) for v in vs)])
        commit = s.get("before", {}).get("commit")
        rows += [
            [label.format(commit), "–", *(cell(s[key]) if n == "batched" else "" for n in names)]
            for key, label, cell in RATIOS
            if key in s
        ]
    head = ["", "exact gossip"] + [_variant_label(s, n) for n in names]
    return [
        f"### {s['model']} · {s['topology']} (degree {s['degree']}) · backend {s['backend']}",
        "",
        f"{s['params']:,} parameters, {s['compressed_fraction'] * 100:.2f} % of them in "
        f"compressed matrices ({_mb(s['compressed_bytes'])}); γ = {s['gamma']:.3f}; {timing}",
        "",
        *table(head, rows),
    ]


def _naive(cell):
    """An isolated-table cell of the naive variant ("–" where the setting has none)."""
    return lambda s: cell(s["isolated"]) if "naive" in s["isolated"]["variants"] else "–"


def _batched(s: Dict[str, Any], what: str, fmt, mean: str = "") -> str:
    b = s["isolated"]["variants"]["batched"]
    cell = f"{fmt(b['right'][what])} / {fmt(b['left'][what])}"
    return cell + (f" / **{fmt(b['all'][what])}**" if mean else "")


ISOLATED = (
    ("model", lambda s: s["model"]),
    ("topology (deg)", lambda s: f"{s['topology']} ({s['isolated']['degree']})"),
    ("backend", lambda s: s["backend"]),
    ("copy GB/s (1 thread)", lambda s: f"{s['isolated']['bandwidth']:.2f}"),
    ("batched compute ms: right / left", lambda s: _batched(s, "compute", _ms)),
    ("batched efficiency: right / left / mean", lambda s: _batched(s, "efficiency", _pct, "mean")),
    ("naive compute ms", _naive(lambda i: _ms(i["variants"]["naive"]["all"]["compute"]))),
    ("naive efficiency", _naive(lambda i: _pct(i["variants"]["naive"]["all"]["efficiency"]))),
    ("naive / batched", _naive(lambda i: f"{i['speedup']:.2f}×")),
)


def render_isolated_table(summaries: List[Dict[str, Any]]) -> List[str]:
    rows = [s for s in summaries if "isolated" in s]
    return columns(ISOLATED, rows) if rows else []


def _before_row(s: Dict[str, Any]) -> List[str]:
    b, o, new = s["before"], s["variants"]["before"], s["variants"]["batched"]
    iso, iso_cell = s.get("isolated", {}), "–"
    if "before_ratio" in iso:
        iv = iso["variants"]
        iso_cell = (
            f"{_ms(iv['before']['all']['compute'])} → {_ms(iv['batched']['all']['compute'])}, "
            f"**{iso['before_ratio']:.2f}×**"
        )
    same = "yes" if b["identical"] else f"**no** (largest difference {b['max_difference']:.1e})"
    return [
        f"{s['model']} · {s['topology']} · {s['backend']}",
        f"{_mb(o['bytes'])} = {_mb(new['bytes'])}: {_yes(b['bytes_equal'])}",
        f"{_ms(o['compute'])} → {_ms(new['compute'])}",
        _x(**b["ratio"]),
        iso_cell,
        same,
    ]


def render_before(summaries: List[Dict[str, Any]]) -> List[str]:
    """This tree's PowerGossip against an earlier commit's, setting by setting, and the spans."""
    rows = [s for s in summaries if "before" in s]
    if not rows:
        return []
    fmt = lambda x: f"{x:.2f}×"  # noqa: E731

    def spread(values: List[float]) -> str:
        return f"{_span(values, fmt)} (median {fmt(_median(values))})"

    isolated = [
        s["isolated"]["before_ratio"] for s in rows if "before_ratio" in s.get("isolated", {})
    ]
    text = fill(
        template(__file__, "before.md"),
        commit=rows[0]["before"]["commit"],
        modules=", ".join(f"`{m}.py`" for m in rows[0]["before"]["modules"]),
        rows=table_rows(map(_before_row, rows)),
        settings=f"{len(rows)} setting{'s' if len(rows) > 1 else ''}",
        compute=spread([s["before"]["ratio"]["compute"] for s in rows]),
        total=spread([s["before"]["ratio"]["total"] for s in rows]),
        isolated=f", isolated compute {spread(isolated)}" if isolated else "",
        bytes_equal=_yes(all(s["before"]["bytes_equal"] for s in rows)),
        identical=_yes(all(s["before"]["identical"] for s in rows)),
    )
    return text.split("\n")


#: The kernel table's columns.
KERNELS = (
    ("kernel", lambda r: r["name"]),
    ("GB/s", lambda r: f"{r['gbps']:.2f}"),
    ("% of copy", lambda r: f"{r['of_copy'] * 100:.0f} %"),
)


def render_kernels(k: Dict[str, Any]) -> List[str]:
    """The kernel diagnosis: kernels.md filled in from the kernels' run."""
    b, rows, cols = k["group"]
    text = fill(
        template(__file__, "kernels.md"),
        b=b,
        rows=rows,
        cols=cols,
        mb=b * rows * cols * 4 / 1e6,
        copy_mb=k.get("copy_mb", 256),
        rounds=k["rounds"],
        copy=k["copy"],
        kernels=columns(KERNELS, k["kernels"]),
        prediction=kernel_prediction(k),
    )
    return text.split("\n")


def render_markdown(
    summaries: List[Dict[str, Any]], kernels: Optional[Dict[str, Any]], header: str, title=""
) -> str:
    """The page: its fixed text is page.md beside this file, the rest comes from the rows."""
    timed = [s for s in summaries if not s["bytes_only"]]
    params = {s["model"]: s["params"] for s in summaries}
    count = {m: params.get(m) or count_params(model_shapes(m)) for m in MODELS}
    return fill(
        template(__file__),
        title=title,
        header=header,
        targets=targets(summaries),
        findings=findings(summaries, kernels),
        before=render_before(timed),
        settings=[line for s in summaries for line in render_setting(s)],
        isolated=render_isolated_table(timed),
        kernels=render_kernels(kernels) if kernels else [],
        **count,
    )
