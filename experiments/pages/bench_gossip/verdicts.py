"""The benchmark page's judgements: the three targets per model, what the kernel speeds alone allow
for a half-step, and what limits the measured numbers, each from the settings' summaries and the
kernels' run."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from experiments.pages._bench import median as _median
from experiments.pages._markdown import snippets, table


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
    """What limits the measured numbers, with the numbers that show it (text: findings.md)."""
    say, L = snippets(__file__, "findings.md"), []
    iso = [s for s in summaries if "isolated" in s]
    vgg = [s for s in iso if s["model"] == "vgg16"]
    speed = {row["key"]: row["of_copy"] for row in kernels["kernels"]} if kernels else {}
    if vgg:
        b = [s["isolated"]["variants"]["batched"] for s in vgg]
        more = ""
        if speed and "k3.left.library" in speed:
            p = _prediction(speed, 3)
            cells = {
                f"{side}_{short}": _pct(speed[f"k3.{side}.{which}"])
                for side in ("right", "left", "update")
                for short, which in (("lib", "library"), ("old", "before"))
            }
            more = say["vgg kernels"].format(
                lib_mean=_pct(p["lib_mean"]), old_mean=_pct(p["old_mean"]), **cells
            )
        L.append(
            say["vgg"].format(
                ratio=_median([v["left"]["compute"] / v["right"]["compute"] for v in b]),
                settings=len(vgg),
                right=_span([v["right"]["efficiency"] for v in b], _pct),
                left=_span([v["left"]["efficiency"] for v in b], _pct),
                kernels=more,
            )
        )
    r20 = [s for s in iso if s["model"] == "resnet20"]
    if r20:
        took = [s["isolated"]["variants"]["batched"]["all"]["compute"] for s in r20]
        passes = [3 * s["compressed_bytes"] / (s["isolated"]["bandwidth"] * 1e9) for s in r20]
        mb = _mb(r20[0]["compressed_bytes"])
        L.append(say["resnet"].format(took=_span(took, _ms), mb=mb, passes=_span(passes, _ms)))
    sp = [s for s in summaries if "speedup" in s and s["model"] == "vgg16"]
    if sp and speed:
        one, lone = speed.get("k1.right.library"), speed.get("k1.left.library")
        L.append(
            say["naive"].format(
                one=_pct(one),
                lone=_pct(lone),
                mv=_pct(speed.get("k1.right.mv")),
                lmv=_pct(speed.get("k1.left.mv")),
                right3=one / speed.get("k3.right.library"),
                left3=lone / speed.get("k3.left.library"),
                gain=_span([s["speedup"]["compute"] for s in sp], lambda x: f"{x:.2f}×"),
            )
        )
    return L + [""] if L else L
