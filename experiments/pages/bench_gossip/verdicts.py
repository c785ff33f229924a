"""The benchmark page's judgements: the three targets per model, what the kernel speeds alone allow
for a half-step, and what limits the measured numbers, each from the settings' summaries and the
kernels' run."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from experiments.pages._bench import median as _median
from experiments.pages._markdown import table


def _mb(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} MB"
    if x >= 1e3:
        return f"{x / 1e3:.2f} kB"
    return f"{x:.0f} B"


def _ms(x: Optional[float]) -> str:
    return "–" if x is None else f"{x * 1e3:.1f}"


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{x * 100:.0f} %"


def _yes(b: bool) -> str:
    return "yes" if b else "**NO**"


def _x(compute: float, total: float) -> str:
    """A compute ratio (bold) and a step-time ratio."""
    return f"**{compute:.2f}×**, {total:.2f}×"


def _span(values: Sequence[float], fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)} – {fmt(hi)}"


TARGET_BYTES_RATIO = 500.0
TARGET_EFFICIENCY = 0.5
TARGET_SPEEDUP = 1.8


def targets(summaries: List[Dict[str, Any]]) -> List[str]:
    """The three targets, judged per model on the measured numbers."""
    verdict = {True: "met", False: "**missed**"}
    by_model: Dict[str, List[Dict[str, Any]]] = {}
    for s in summaries:
        by_model.setdefault(s["model"], []).append(s)
    rows = []  # target, model, measured, met?
    for model in ("vgg16", "vgg16_bn", "resnet20"):
        found = by_model.get(model, [])
        if found:
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
        found = [s for s in by_model.get(model, []) if "isolated" in s]
        if found:
            effs = [s["isolated"]["variants"]["batched"]["all"]["efficiency"] for s in found]
            situ = [s["variants"]["batched"]["efficiency_in_situ"] for s in found]
            rows.append(
                [f"compute efficiency ≥ {TARGET_EFFICIENCY * 100:.0f} % (batched)", model]
                + [
                    f"isolated peer {_span(effs, _pct)}; in situ {_span(situ, _pct)} "
                    f"({len(found)} setting{'s' if len(found) > 1 else ''})"
                ]
                + [verdict[min(effs) >= TARGET_EFFICIENCY]]
            )
    for label, pick in (
        ("torus:2x4 (degree 3)", lambda s: s["topology"] == "torus:2x4"),
        ("degree 4 (`small_world:8:4:0`)", lambda s: s["degree"] == 4),
    ):
        for model in ("vgg16", "resnet20"):
            found = [s for s in by_model.get(model, []) if "speedup" in s and pick(s)]
            if found:
                rows.append(
                    [f"batched ≥ {TARGET_SPEEDUP}× faster than naive (compute per step), {label}"]
                    + [model, "; ".join(map(_speedup, found))]
                    + [verdict[all(s["speedup"]["compute"] >= TARGET_SPEEDUP for s in found)]]
                )
    return table(["target", "model", "measured", "met?"], rows)


def _speedup(s: Dict[str, Any]) -> str:
    iso = s.get("isolated", {}).get("speedup")
    return f"{s['backend']} {s['speedup']['compute']:.2f}×" + (
        f" (isolated {iso:.2f}×)" if iso else ""
    )


def kernel_prediction(k: Dict[str, Any]) -> List[str]:
    """Efficiency that the kernel speeds alone allow (largest VGG-16 group, no per-op overhead):
    a right half-step costs 1/a_right + 2/a_update copy-times of M, a left one 1/a_left + 2/a_update."""
    speed = {row["key"]: row["of_copy"] for row in k["kernels"]}
    head = [
        "k = degree × rank",
        "library kernels (factors stored Qᵀ, Pᵀ): right / left / mean",
        "first formulation (factors stored Q, P): right / left / mean",
    ]
    rows = []
    for kk in sorted({row["k"] for row in k["kernels"]}):
        p = _prediction(speed, kk)
        sides = [
            " / ".join(_pct(p[f"{n}_{s}"]) for s in ("right", "left", "mean"))
            for n in ("lib", "old")
        ]
        rows.append([str(kk), *sides])
    return table(head, rows)


def _prediction(speed: Dict[str, float], k: int) -> Dict[str, float]:
    """Half-step efficiency the kernel speeds (fractions of the copy) alone allow, at k columns:
    "lib_*" the library's kernels, "old_*" the first formulation's."""
    out = {}
    for name, which in (("lib", "library"), ("old", "before")):
        g = lambda key: speed[f"k{k}.{key}.{which}"]  # noqa: E731
        right, left = 1 / g("right") + 2 / g("update"), 1 / g("left") + 2 / g("update")
        out.update({f"{name}_right": 3 / right, f"{name}_left": 3 / left})
        out[f"{name}_mean"] = 6 / (right + left)
    return out


def findings(summaries: List[Dict[str, Any]], kernels: Optional[Dict[str, Any]]) -> List[str]:
    """What limits the measured numbers, with the numbers that show it."""
    L: List[str] = []
    iso = [s for s in summaries if "isolated" in s]
    vgg = [s for s in iso if s["model"] == "vgg16"]
    speed = {row["key"]: row["of_copy"] for row in kernels["kernels"]} if kernels else {}
    if vgg:
        b = [s["isolated"]["variants"]["batched"] for s in vgg]
        ratio = _median([v["left"]["compute"] / v["right"]["compute"] for v in b])
        text = (
            f"* **VGG-16 efficiency is bounded by the product kernels, not by memory.** In the "
            f"isolated runs the left half-step takes {ratio:.2f}× as long as the right one "
            f"(median over {len(vgg)} settings; efficiency right "
            f"{_span([v['right']['efficiency'] for v in b], _pct)}, left "
            f"{_span([v['left']['efficiency'] for v in b], _pct)}), although both move the same "
            "bytes."
        )
        if speed and "k3.left.library" in speed:
            g = lambda key: speed[f"k3.{key}"]  # noqa: E731
            p = _prediction(speed, 3)
            text += (
                f" At k = 3 (torus:2x4), the library's kernels run at {_pct(g('right.library'))} "
                f"(right product), {_pct(g('left.library'))} (left product) and "
                f"{_pct(g('update.library'))} (update) of the copy bandwidth; the first "
                "formulation, with factors stored rows × r (`bmm(M, Q)`, `bmm(Mᵀ view, P)`, "
                f"`baddbmm_(P, Qᵀ view)`), runs at {_pct(g('right.before'))}, "
                f"{_pct(g('left.before'))} and {_pct(g('update.before'))}. Those kernel speeds alone "
                f"cap a half-step at {_pct(p['lib_mean'])} now ({_pct(p['old_mean'])} with the "
                "first formulation; table in *Kernel diagnosis*); the per-neighbour small ops "
                "take the rest."
            )
        L.append(text)
    r20 = [s for s in iso if s["model"] == "resnet20"]
    if r20:
        took = [s["isolated"]["variants"]["batched"]["all"]["compute"] for s in r20]
        passes = [3 * s["compressed_bytes"] / (s["isolated"]["bandwidth"] * 1e9) for s in r20]
        L.append(
            f"* **ResNet-20 is bound by per-operation overhead.** An isolated batched half-step "
            f"takes {_span(took, _ms)} ms where three passes over its "
            f"{_mb(r20[0]['compressed_bytes'])} of matrices would take "
            f"{_span(passes, _ms)} ms at the measured copy bandwidth: the time goes to "
            "the hundreds of small tensor operations per half-step (per neighbour and per shape "
            "group: orthonormalising the factor, slicing it into the side-by-side buffer, copying "
            "products into the message, forming the new factor, scaling it), which batching the "
            "two big multiplications does not remove. Hence also its smaller batched/naive gain."
        )
    sp = [s for s in summaries if "speedup" in s and s["model"] == "vgg16"]
    if sp and speed:
        one, lone = speed.get("k1.right.library"), speed.get("k1.left.library")
        mv, lmv = speed.get("k1.right.mv"), speed.get("k1.left.mv")
        three = [speed.get("k3.right.library"), speed.get("k3.left.library")]
        L.append(
            f"* **The naive baseline runs the same kernels once per neighbour.** Its "
            f"one-column products run at {_pct(one)} (right) and {_pct(lone)} (left) of the copy "
            f"bandwidth (`torch.mv`: {_pct(mv)} and {_pct(lmv)}). A three-column product takes "
            f"{one / three[0]:.2f}× (right) and {lone / three[1]:.2f}× (left) the time of a "
            "one-column one, against 3× for three one-column products; the measured gain of the "
            f"batched path over the naive one is "
            f"{_span([s['speedup']['compute'] for s in sp], lambda x: f'{x:.2f}×')} on VGG-16."
        )
    if L:
        L.append("")
    return L
