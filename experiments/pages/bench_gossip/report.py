"""The benchmark's page: targets, findings, per-setting tables, the isolated-peer and kernel tables,
all rendered from the summaries (and the kernel records, looked up by their `key`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from experiments.pages._bench import MODELS, count_params, model_shapes
from experiments.pages._bench import median as _median
from experiments.pages._markdown import fill, table, template

from .verdicts import _mb, _ms, _pct, _span, _yes, findings, kernel_prediction, targets


def _variant_label(s: Dict[str, Any], name: str) -> str:
    if name == "before":
        return f"PowerGossip r=1 batched, `{s['before']['commit']}`"
    return f"PowerGossip r=1 {name}"


def render_setting(s: Dict[str, Any]) -> List[str]:
    names = list(s["variants"])
    head = ["", "exact gossip"] + [_variant_label(s, n) for n in names]
    L = [f"### {s['model']} · {s['topology']} (degree {s['degree']}) · backend {s['backend']}", ""]
    L.append(
        f"{s['params']:,} parameters, {s['compressed_fraction'] * 100:.2f} % of them in "
        f"compressed matrices ({_mb(s['compressed_bytes'])}); γ = {s['gamma']:.3f}; "
        + (
            "bytes only (2 steps)."
            if s["bytes_only"]
            else f"{s['reps']} interleaved blocks of {s['block_steps']} steps per variant; exact "
            f"gossip timed over {s['exact_steps']} step(s)"
            + (" after a warm-up step" if s["exact_warmup"] else " (its first, no warm-up)")
            + f"; {s['seconds']:.0f} s."
        )
    )
    ex, vs = s["exact"], [s["variants"][n] for n in names]
    rows = [
        [
            "bytes / peer / step (transport counters)",
            _mb(ex["bytes"]),
            *(_mb(v["bytes"]) for v in vs),
        ],
        ["… right / left half-step", "–"]
        + [f"{_mb(v['bytes_right'])} / {_mb(v['bytes_left'])}" for v in vs],
        ["counters = `bytes_per_step()` every step", _yes(ex["bytes_match"])]
        + [_yes(v["bytes_match"]) for v in vs],
        ["bytes ratio exact / PowerGossip", "1", *(f"**{v['bytes_ratio']:.0f}×**" for v in vs)],
    ]
    if not s["bytes_only"]:
        for key, label in TIMES:
            rows.append([label, _ms(ex.get(key)), *(_ms(v[key]) for v in vs)])
        bw = s["bandwidth_concurrent"]
        rows.append(
            [f"compute efficiency in situ (vs {bw:.2f} GB/s per peer, all copying)", "–"]
            + [_pct(v.get("efficiency_in_situ")) for v in vs]
        )
        for key, label, cell in RATIOS:
            if key in s:
                cells = [cell(s[key]) if n == "batched" else "" for n in names]
                rows.append([label.format(s.get("before", {}).get("commit")), "–", *cells])
    return L + [""] + table(head, rows)


TIMES = (
    ("total", "time / step (ms)"),
    ("compute", "… compute (ms)"),
    ("comm", "… communication (ms)"),
)
RATIOS = (
    (
        "speedup",
        "naive / batched: compute, step time",
        lambda r: f"**{r['compute']:.2f}×**, {r['total']:.2f}×",
    ),
    (
        "before",
        "this tree / `{}`: compute, step time",
        lambda r: f"**{r['ratio']['compute']:.2f}×**, {r['ratio']['total']:.2f}×",
    ),
)


def render_isolated_table(summaries: List[Dict[str, Any]]) -> List[str]:
    rows = [s for s in summaries if "isolated" in s]
    if not rows:
        return []
    L = [
        "| model | topology (deg) | backend | copy GB/s (1 thread) | batched compute ms: right / left "
        "| batched efficiency: right / left / mean | naive compute ms | naive efficiency | "
        "naive / batched |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        iso = s["isolated"]
        b = iso["variants"]["batched"]
        nv = iso["variants"].get("naive")
        L.append(
            f"| {s['model']} | {s['topology']} ({iso['degree']}) | {s['backend']} | "
            f"{iso['bandwidth']:.2f} | {_ms(b['right']['compute'])} / {_ms(b['left']['compute'])} | "
            f"{_pct(b['right']['efficiency'])} / {_pct(b['left']['efficiency'])} / "
            f"**{_pct(b['all']['efficiency'])}** | "
            + (
                f"{_ms(nv['all']['compute'])} | {_pct(nv['all']['efficiency'])} | "
                f"{iso['speedup']:.2f}× |"
                if nv
                else "– | – | – |"
            )
        )
    L.append("")
    return L


def render_before(summaries: List[Dict[str, Any]]) -> List[str]:
    """This tree's PowerGossip against an earlier commit's, setting by setting, and the spans."""
    rows = [s for s in summaries if "before" in s]
    if not rows:
        return []
    commit = rows[0]["before"]["commit"]
    L = [
        f"## This tree's PowerGossip against `{commit}`'s, in the same run",
        "",
        f"`{commit}`'s PowerGossip, `powergossip.py` with the `algorithms/` modules it imports ("
        + ", ".join(f"`{m}.py`" for m in rows[0]["before"]["modules"])
        + " in all), is read with `git show` and imported beside this tree's "
        "(`experiments/pages/_commit_code.py`), so both run on this tree's transports, in the same "
        "processes, on the same parameters, batched (`batch_neighbors=True`), in interleaved "
        "blocks (order alternating, and the two swap places every second pair of blocks), after "
        "the same warm-up. Ratios are this tree's time over "
        f"`{commit}`'s (below 1: this tree is faster), medians over adjacent block pairs; the "
        "isolated ratio is the same for peer 0 alone on the loopback transport (no waiting for "
        "a core). Bytes: every step of every peer compared. Parameters: every peer's final "
        "tensors compared byte for byte after the same steps.",
        "",
        f"| model · topology · backend | bytes / step, `{commit}` = this tree | compute ms / "
        f"step, `{commit}` → this tree | this tree / `{commit}`: compute, step time | isolated: "
        f"compute ms `{commit}` → this tree, ratio | final parameters bit-identical |",
        "|---|---|---|---|---|---|",
    ]
    for s in rows:
        b, o = s["before"], s["variants"]["before"]
        new = s["variants"]["batched"]
        iso = s.get("isolated", {})
        iso_cell = "–"
        if "before_ratio" in iso:
            iv = iso["variants"]
            iso_cell = (
                f"{_ms(iv['before']['all']['compute'])} → {_ms(iv['batched']['all']['compute'])}, "
                f"**{iso['before_ratio']:.2f}×**"
            )
        same = "yes" if b["identical"] else f"**no** (largest difference {b['max_difference']:.1e})"
        L.append(
            f"| {s['model']} · {s['topology']} · {s['backend']} | "
            f"{_mb(o['bytes'])} = {_mb(new['bytes'])}: {_yes(b['bytes_equal'])} | "
            f"{_ms(o['compute'])} → {_ms(new['compute'])} | "
            f"**{b['ratio']['compute']:.2f}×**, {b['ratio']['total']:.2f}× | {iso_cell} | {same} |"
        )
    fmt = lambda x: f"{x:.2f}×"  # noqa: E731
    compute = [s["before"]["ratio"]["compute"] for s in rows]
    total = [s["before"]["ratio"]["total"] for s in rows]
    isolated = [
        s["isolated"]["before_ratio"] for s in rows if "before_ratio" in s.get("isolated", {})
    ]
    L += [
        "",
        f"Over the {len(rows)} setting{'s' if len(rows) > 1 else ''}, this tree / `{commit}`: compute per step "
        f"{_span(compute, fmt)} (median {fmt(_median(compute))}), step time {_span(total, fmt)} "
        f"(median {fmt(_median(total))})"
        + (
            f", isolated compute {_span(isolated, fmt)} (median {fmt(_median(isolated))})"
            if isolated
            else ""
        )
        + f". Bytes equal at every step of every peer in all settings: "
        f"{_yes(all(s['before']['bytes_equal'] for s in rows))}; final parameters bit-identical "
        f"in all settings: {_yes(all(s['before']['identical'] for s in rows))}.",
        "",
    ]
    return L


def render_kernels(k: Dict[str, Any]) -> List[str]:
    b, rows, cols = k["group"]
    L = [
        f"One thread, {b} stacked {rows}×{cols} matrices (VGG-16's largest group, "
        f"{b * rows * cols * 4 / 1e6:.0f} MB). GB/s counts the matrix bytes each kernel must move "
        "(a product reads M once; the update reads and writes it). Each kernel runs right after a "
        f"{k.get('copy_mb', 256)} MB copy; '% of copy' is the median over {k['rounds']} rounds of "
        f"the ratio of the two (the copies ran at {k['copy']:.2f} GB/s, median). A read-only kernel "
        "can exceed 100 %: the copy also writes. k = degree × rank columns; k = 1 is also what the "
        "naive path multiplies by, once per neighbour.",
        "",
        "| kernel | GB/s | % of copy |",
        "|---|---|---|",
    ]
    for row in k["kernels"]:
        L.append(f"| {row['name']} | {row['gbps']:.2f} | {row['of_copy'] * 100:.0f} % |")
    L.append("")
    return L


def render_markdown(
    summaries: List[Dict[str, Any]], kernels: Optional[Dict[str, Any]], header: str, title=""
) -> str:
    """The page: its fixed text is page.md beside this file, the rest comes from the rows."""
    timed = [s for s in summaries if not s["bytes_only"]]
    params = {s["model"]: s["params"] for s in summaries}
    count = {m: params.get(m) or count_params(model_shapes(m)) for m in MODELS}
    diagnosis = []
    if kernels:
        diagnosis = ["## Kernel diagnosis", "", *render_kernels(kernels)]
        diagnosis += [
            "What those kernel speeds alone allow for a half-step (3 copy-times of M = 100 %; no "
            "per-operation overhead counted):",
            "",
            *kernel_prediction(kernels),
        ]
    return fill(
        template(__file__),
        title=title,
        header=header,
        targets=targets(summaries),
        findings=findings(summaries, kernels),
        before=render_before(timed),
        settings=[line for s in summaries for line in render_setting(s)],
        isolated=render_isolated_table(timed),
        kernels=diagnosis,
        **count,
    )
