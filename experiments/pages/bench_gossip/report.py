"""The benchmark's page from the settings' summaries and the kernels' run: the targets judged per
model, what limits the numbers, the earlier commit's PowerGossip beside this tree's, per-setting
tables, the isolated-peer and kernel tables. Fixed text: the .md files beside this one."""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, Optional, Sequence

from experiments.pages._bench import MODELS, count_params, fmt_bytes, median, model_shapes
from experiments.pages._markdown import columns, fill, snippets, table, table_rows, template

PARTS = snippets(__file__, "parts.md")
TARGET_BYTES_RATIO, TARGET_EFFICIENCY, TARGET_SPEEDUP = 500.0, 0.5, 1.8


_mb = functools.partial(fmt_bytes, fmt=".2f")


def _ms(x: Optional[float]) -> str:
    return "–" if x is None else f"{x * 1e3:.1f}"


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{x * 100:.0f} %"


def _yes(b: bool) -> str:
    return "yes" if b else "**NO**"


def _x(compute: float, total: Optional[float] = None) -> str:
    """A ratio "1.23×"; with `total`, a compute ratio (bold) and a step-time ratio."""
    return f"{compute:.2f}×" if total is None else f"**{compute:.2f}×**, {total:.2f}×"


def _span(values: Sequence[float], fmt) -> str:
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo} – {hi}"


def _settings(n: int) -> str:
    return f"{n} setting{'s' if n > 1 else ''}"


def targets(summaries: List[Dict[str, Any]]) -> List[str]:
    """The three targets, judged per model on the measured numbers."""
    verdict = {True: "met", False: "**missed**"}
    by_model = {model: [s for s in summaries if s["model"] == model] for model in MODELS}
    rows = []  # target, model, measured, met?
    for model in ("vgg16", "vgg16_bn", "resnet20"):
        if found := by_model[model]:
            ratios = [s["variants"]["batched"]["bytes_ratio"] for s in found]
            above = min(ratios) >= TARGET_BYTES_RATIO
            where = ", ".join(f"{s['topology']}/{s['backend']}" for s in found)
            where = f"all {len(found)} settings" if len(found) > 2 else where
            judged = f"n/a (the target is for vgg16; {'above' if above else 'below'} it)"
            rows.append(
                [f"≥ {TARGET_BYTES_RATIO:.0f}× fewer bytes than exact gossip, rank 1", model]
                + [f"{_span(ratios, lambda x: f'{x:.0f}×')} ({where})"]
                + [verdict[above] if model == "vgg16" else judged]
            )
    for model in ("vgg16", "resnet20"):
        if found := [s for s in by_model[model] if "isolated" in s]:
            effs = [s["isolated"]["variants"]["batched"]["all"]["efficiency"] for s in found]
            situ = [s["variants"]["batched"]["efficiency_in_situ"] for s in found]
            measured = f"isolated peer {_span(effs, _pct)}; in situ {_span(situ, _pct)}"
            rows.append(
                [f"compute efficiency ≥ {TARGET_EFFICIENCY * 100:.0f} % (batched)", model]
                + [f"{measured} ({_settings(len(found))})", verdict[min(effs) >= TARGET_EFFICIENCY]]
            )
    for label, pick in (
        ("torus:2x4 (degree 3)", lambda s: s["topology"] == "torus:2x4"),
        ("degree 4 (`small_world:8:4:0`)", lambda s: s["degree"] == 4),
    ):
        for model in ("vgg16", "resnet20"):
            if found := [s for s in by_model[model] if "speedup" in s and pick(s)]:
                rows.append(
                    [f"batched ≥ {TARGET_SPEEDUP}× faster than naive (compute per step), {label}"]
                    + [model, "; ".join(map(_speedup, found))]
                    + [verdict[all(s["speedup"]["compute"] >= TARGET_SPEEDUP for s in found)]]
                )
    return table(["target", "model", "measured", "met?"], rows)


def _speedup(s: Dict[str, Any]) -> str:
    iso = s.get("isolated", {}).get("speedup")
    return f"{s['backend']} {_x(s['speedup']['compute'])}" + (f" (isolated {_x(iso)})" * bool(iso))


def _prediction(speed: Dict[str, float], k: int) -> Dict[str, float]:
    """Half-step efficiency the kernel speeds (fractions of the copy) alone allow at k columns
    (a right half-step costs 1/a_right + 2/a_update copy-times of M, a left one 1/a_left +
    2/a_update): "lib_*" the library's kernels, "old_*" the first formulation's."""
    out = {}
    for name, which in (("lib", "library"), ("old", "before")):
        g = lambda key: speed[f"k{k}.{key}.{which}"]  # noqa: E731
        right, left = 1 / g("right") + 2 / g("update"), 1 / g("left") + 2 / g("update")
        out.update({f"{name}_right": 3 / right, f"{name}_left": 3 / left})
        out[f"{name}_mean"] = 6 / (right + left)
    return out


def kernel_prediction(k: Dict[str, Any]) -> List[str]:
    """The efficiency the kernel speeds alone allow (largest VGG-16 group, no per-op overhead): the
    rows of kernels.md's last table."""
    speed = {row["key"]: row["of_copy"] for row in k["kernels"]}
    rows = []
    for kk in sorted({row["k"] for row in k["kernels"]}):
        p = _prediction(speed, kk)
        sides = (
            " / ".join(_pct(p[f"{n}_{s}"]) for s in ("right", "left", "mean"))
            for n in ("lib", "old")
        )
        rows.append([str(kk), *sides])
    return [*table_rows(rows), ""]


def findings(summaries: List[Dict[str, Any]], kernels: Optional[Dict[str, Any]]) -> List[str]:
    """What limits the measured numbers, with the numbers that show it (text: parts.md)."""
    out = []
    iso = [s for s in summaries if "isolated" in s]
    speed = {row["key"]: row["of_copy"] for row in kernels["kernels"]} if kernels else {}
    pct = {key.replace(".", "_"): _pct(x) for key, x in speed.items()}  # "k3_left_library": "63 %"
    if vgg := [s["isolated"]["variants"]["batched"] for s in iso if s["model"] == "vgg16"]:
        more = ""
        if "k3.left.library" in speed:
            p = _prediction(speed, 3)
            more = PARTS["vgg kernels"].format(**pct, **{k: _pct(x) for k, x in p.items()})
        out.append(
            PARTS["vgg"].format(
                ratio=median([v["left"]["compute"] / v["right"]["compute"] for v in vgg]),
                settings=len(vgg),
                right=_span([v["right"]["efficiency"] for v in vgg], _pct),
                left=_span([v["left"]["efficiency"] for v in vgg], _pct),
                kernels=more,
            )
        )
    if r20 := [s for s in iso if s["model"] == "resnet20"]:
        took = [s["isolated"]["variants"]["batched"]["all"]["compute"] for s in r20]
        passes = [3 * s["compressed_bytes"] / (s["isolated"]["bandwidth"] * 1e9) for s in r20]
        mb = _mb(r20[0]["compressed_bytes"])
        out.append(PARTS["resnet"].format(took=_span(took, _ms), mb=mb, passes=_span(passes, _ms)))
    if speed and (sp := [s for s in summaries if "speedup" in s and s["model"] == "vgg16"]):
        right3 = speed["k1.right.library"] / speed["k3.right.library"]
        left3 = speed["k1.left.library"] / speed["k3.left.library"]
        gain = _span([s["speedup"]["compute"] for s in sp], _x)
        out.append(PARTS["naive"].format(**pct, right3=right3, left3=left3, gain=gain))
    return out + [""] if out else out


def _bytes_cells(d: Dict[str, Any], exact: bool) -> List[str]:
    """A setting table's byte rows, the cells of exact gossip or of a PowerGossip variant."""
    halves = "–" if exact else f"{_mb(d['bytes_right'])} / {_mb(d['bytes_left'])}"
    ratio = "1" if exact else f"**{d['bytes_ratio']:.0f}×**"
    return [_mb(d["bytes"]), halves, _yes(d["bytes_match"]), ratio]


BYTE_ROWS = (
    "bytes / peer / step (transport counters)",
    "… right / left half-step",
    "counters = `bytes_per_step()` every step",
    "bytes ratio exact / PowerGossip",
)
TIMES = (("total", "time / step (ms)"), ("compute", "… compute (ms)"))
TIMES += (("comm", "… communication (ms)"),)
#: Ratios shown in the batched column only: (summary key, label, cell).
RATIOS = (
    ("speedup", "naive / batched: compute, step time", lambda r: _x(r["compute"], r["total"])),
    ("before", "this tree / `{}`: compute, step time", lambda r: _x(**r["ratio"])),
)


def render_setting(s: Dict[str, Any]) -> List[str]:
    """A setting's heading, what it measured, and its table."""
    names = list(s["variants"])
    ex, vs = s["exact"], [s["variants"][n] for n in names]
    columns_ = [_bytes_cells(ex, True), *(_bytes_cells(v, False) for v in vs)]
    rows = [[label, *cells] for label, *cells in zip(BYTE_ROWS, *columns_)]
    timing = "bytes only (2 steps)."
    if not s["bytes_only"]:
        warm = " after a warm-up step" if s["exact_warmup"] else " (its first, no warm-up)"
        timing = PARTS["timing"].format(warm=warm, **s)
        rows += [[label, _ms(ex.get(key)), *(_ms(v[key]) for v in vs)] for key, label in TIMES]
        bw = f"compute efficiency in situ (vs {s['bandwidth_concurrent']:.2f} GB/s per peer, all copying)"
        rows.append([bw, "–", *(_pct(v.get("efficiency_in_situ")) for v in vs)])
        commit = s.get("before", {}).get("commit")
        rows += [
            [label.format(commit), "–", *(cell(s[key]) if n == "batched" else "" for n in names)]
            for key, label, cell in RATIOS
            if key in s
        ]
    named = {"before": f"batched, `{s.get('before', {}).get('commit')}`"}
    head = ["", "exact gossip", *(f"PowerGossip r=1 {named.get(n, n)}" for n in names)]
    mb, percent = _mb(s["compressed_bytes"]), s["compressed_fraction"] * 100
    text = PARTS["setting"].format(timing=timing, mb=mb, percent=percent, **s)
    return [*text.split("\n"), "", *table(head, rows)]


def _batched(s: Dict[str, Any], what: str, fmt, mean: bool = False) -> str:
    b = s["isolated"]["variants"]["batched"]
    cell = f"{fmt(b['right'][what])} / {fmt(b['left'][what])}"
    return cell + (f" / **{fmt(b['all'][what])}**" if mean else "")


def _naive(cell):
    """An isolated-table cell of the naive variant ("–" where the setting has none)."""
    return lambda s: cell(s["isolated"]) if "naive" in s["isolated"]["variants"] else "–"


ISOLATED = (
    ("model", lambda s: s["model"]),
    ("topology (deg)", lambda s: f"{s['topology']} ({s['isolated']['degree']})"),
    ("backend", lambda s: s["backend"]),
    ("copy GB/s (1 thread)", lambda s: f"{s['isolated']['bandwidth']:.2f}"),
    ("batched compute ms: right / left", lambda s: _batched(s, "compute", _ms)),
    ("batched efficiency: right / left / mean", lambda s: _batched(s, "efficiency", _pct, True)),
    ("naive compute ms", _naive(lambda i: _ms(i["variants"]["naive"]["all"]["compute"]))),
    ("naive efficiency", _naive(lambda i: _pct(i["variants"]["naive"]["all"]["efficiency"]))),
    ("naive / batched", _naive(lambda i: f"{i['speedup']:.2f}×")),
)


def _before_row(s: Dict[str, Any]) -> List[str]:
    b, o, new = s["before"], s["variants"]["before"], s["variants"]["batched"]
    iso, iso_cell = s.get("isolated", {}), "–"
    if "before_ratio" in iso:
        old_ms, new_ms = (_ms(iso["variants"][v]["all"]["compute"]) for v in ("before", "batched"))
        iso_cell = f"{old_ms} → {new_ms}, **{iso['before_ratio']:.2f}×**"
    same = "yes" if b["identical"] else f"**no** (largest difference {b['max_difference']:.1e})"
    setting = f"{s['model']} · {s['topology']} · {s['backend']}"
    sent = f"{_mb(o['bytes'])} = {_mb(new['bytes'])}: {_yes(b['bytes_equal'])}"
    compute = f"{_ms(o['compute'])} → {_ms(new['compute'])}"
    return [setting, sent, compute, _x(**b["ratio"]), iso_cell, same]


def render_before(summaries: List[Dict[str, Any]]) -> List[str]:
    """This tree's PowerGossip against an earlier commit's, setting by setting, and the spans."""
    if not (rows := [s for s in summaries if "before" in s]):
        return []

    def spread(values: List[float]) -> str:
        return f"{_span(values, _x)} (median {_x(median(values))})"

    isolated = [
        s["isolated"]["before_ratio"] for s in rows if "before_ratio" in s.get("isolated", {})
    ]
    text = fill(
        template(__file__, "before.md"),
        commit=rows[0]["before"]["commit"],
        modules=", ".join(f"`{m}.py`" for m in rows[0]["before"]["modules"]),
        rows=table_rows(map(_before_row, rows)),
        settings=_settings(len(rows)),
        compute=spread([s["before"]["ratio"]["compute"] for s in rows]),
        total=spread([s["before"]["ratio"]["total"] for s in rows]),
        isolated=f", isolated compute {spread(isolated)}" if isolated else "",
        bytes_equal=_yes(all(s["before"]["bytes_equal"] for s in rows)),
        identical=_yes(all(s["before"]["identical"] for s in rows)),
    )
    return text.split("\n")


KERNELS = (
    ("kernel", lambda r: r["name"]),
    ("GB/s", lambda r: f"{r['gbps']:.2f}"),
    ("% of copy", lambda r: f"{r['of_copy'] * 100:.0f} %"),
)


def render_kernels(k: Dict[str, Any]) -> List[str]:
    """The kernel diagnosis: kernels.md filled in from the kernels' run."""
    fields = dict(k, mb=math.prod(k["group"]) * 4 / 1e6)
    fields.update(kernels=columns(KERNELS, k["kernels"]), prediction=kernel_prediction(k))
    return fill(template(__file__, "kernels.md"), **fields).split("\n")


def render_markdown(
    summaries: List[Dict[str, Any]], kernels: Optional[Dict[str, Any]], header: str, title=""
) -> str:
    """The page: its fixed text is page.md beside this file, the rest comes from the rows."""
    timed = [s for s in summaries if not s["bytes_only"]]
    params = {s["model"]: s["params"] for s in summaries}
    isolated = [s for s in timed if "isolated" in s]
    return fill(
        template(__file__),
        title=title,
        header=header,
        targets=targets(summaries),
        findings=findings(summaries, kernels),
        before=render_before(timed),
        settings=[line for s in summaries for line in render_setting(s)],
        isolated=columns(ISOLATED, isolated) if isolated else [],
        kernels=render_kernels(kernels) if kernels else [],
        **{m: params.get(m) or count_params(model_shapes(m)) for m in MODELS},
    )
