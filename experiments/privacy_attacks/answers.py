"""The privacy-attacks pages' answers in words, computed from the rows (no number typed by hand):
do low-rank messages leak less than full models, and at which epsilon the neighbour's TPR at a
low FPR reaches chance."""

from __future__ import annotations

import math
import statistics
from typing import List

from .rows import HEADLINE, _band, _last, _reconstructions, _strongest, groups, label


def _eps_text(e: float) -> str:
    return "∞" if math.isinf(e) else f"{e:g}"


def _mean(group, key) -> float:
    return statistics.fmean(_last(r)["flat"][key] for r in group)


def answers(rows) -> List[str]:
    """The page's two questions, answered from the rows (no number typed by hand)."""
    gs = {(g[0]["spec"], g[0]["target"]): g for g in groups(rows)}
    out = []
    exact = gs.get(("exact", None))
    for spec in ("powergossip:rank=1", "powergossip:rank=4", "choco:compressor=sign,gamma=1.0"):
        g = gs.get((spec, None))
        if exact is None or g is None:
            continue
        best = _strongest(g)
        e_auc = _mean(exact, f"auc/victim/{HEADLINE}")
        c_auc = _mean(g, f"auc/{best}/{HEADLINE}")
        v_auc = _mean(g, f"auc/victim/{HEADLINE}")
        e_tpr = _mean(exact, f"tpr1/victim/{HEADLINE}")
        c_tpr = _mean(g, f"tpr1/{best}/{HEADLINE}")
        # equal bytes: exact gossip's round whose received MB is closest to this run's total
        mb = g[0]["observed_mb"]
        r0 = exact[0]
        a_g = statistics.fmean(r["acc_avg"] for r in g)
        a_e = statistics.fmean(r["acc_avg"] for r in exact)
        sd_g = statistics.stdev([r["acc_avg"] for r in g]) if len(g) > 1 else 0.0
        sd_e = statistics.stdev([r["acc_avg"] for r in exact]) if len(exact) > 1 else 0.0
        step = min(
            r0["round_steps"], key=lambda s: abs(r0["observed_mb"] * (s + 1) / r0["steps"] - mb)
        )
        at = statistics.fmean(
            r["rounds"][str(step)]["flat"][f"auc/victim/{HEADLINE}"] for r in exact
        )
        out.append(
            f"- **{label(spec)}** (no DP): through its strongest reconstruction ({best}) the "
            f"neighbour's {HEADLINE} AUC is {c_auc:.3f} and TPR at 1 % FPR {c_tpr:.4f}, against "
            f"{e_auc:.3f} / {e_tpr:.4f} for exact gossip, whose messages are the model, at "
            f"averaged-model accuracy {100 * a_g:.1f} % vs {100 * a_e:.1f} % ("
            + (
                "equal within the seeds' spread"
                if abs(a_g - a_e) <= sd_g + sd_e
                else "not equal: more than the seeds' spread apart"
            )
            + f"), and the victim's own model gives {v_auc:.3f}. The observer received "
            f"{mb:.3g} MB against {r0['observed_mb']:.3g} MB; at the exact-gossip round closest to "
            f"equal bytes (step {step}, {r0['observed_mb'] * (step + 1) / r0['steps']:.3g} MB) "
            f"exact gossip's AUC is {at:.3f}."
        )
    targets = sorted({t for (_, t) in gs if t is not None})
    lira = ("LiRA offline", "LiRA online")
    for spec in dict.fromkeys(s for (s, _) in gs):
        parts, above, at_chance, aucs_by_eps, bands = [], [], [], [], {}

        for t in targets + [None]:
            g = gs.get((spec, t))
            if g is None:
                continue
            band = _band(g[0])
            models = ["victim"] + ([_strongest(g)] if _reconstructions(g[0]) else [])
            tprs = [_mean(g, f"tpr0.1/{m}/{a}") for m in models for a in lira]
            aucs = [_mean(g, f"auc/{m}/{a}") for m in models for a in lira]
            chance = all(v <= band["tpr"][0][1] for v in tprs)
            key = math.inf if t is None else t
            aucs_by_eps.append((key, aucs))
            bands[key] = band["auc"][1]
            (at_chance if chance else above).append(math.inf if t is None else t)
            acc = statistics.fmean(r["acc_avg"] for r in g)
            parts.append(
                f"ε {'∞' if t is None else f'{t:g}'}: TPR @ 0.1 % FPR "
                + " / ".join(f"{v:.4f}" for v in tprs)
                + f" (null band up to {band['tpr'][0][1]:.4f}: "
                f"{'chance' if chance else 'above chance'}), AUC "
                + " / ".join(f"{v:.3f}" for v in aucs)
                + f" (band up to {band['auc'][1]:.3f}); accuracy {100 * acc:.1f} %"
            )
        if parts:
            order = "LiRA offline / online" + (
                " through the victim's model, then through the strongest reconstruction"
                if _reconstructions(gs[next(k for k in gs if k[0] == spec)][0])
                else " through the victim's model (the messages are the model)"
            )
            verdict = ""
            if above and at_chance:
                high = min(above)
                low = max((e for e in at_chance if e < high), default=None)
                verdict = (
                    (
                        " TPR above chance only without DP"
                        if math.isinf(high)
                        else f" TPR above chance at ε ≥ {_eps_text(high)}"
                    )
                    + (f", at chance at every ε ≤ {_eps_text(low)}" if low is not None else "")
                    + (
                        " (not monotone in ε: a chance row above an above-chance one)"
                        if any(e > high for e in at_chance)
                        else ""
                    )
                    + "."
                )
            auc_above = [e for e, a in aucs_by_eps if min(a) > bands[e]]
            if len(aucs_by_eps) > 1:
                verdict += (
                    " The AUC is above its null band at "
                    + (
                        "every ε tried"
                        if len(auc_above) == len(aucs_by_eps)
                        else "ε = " + ", ".join(_eps_text(e) for e in auc_above)
                        if auc_above
                        else "no ε tried"
                    )
                    + "."
                )
            out.append(f"- {label(spec)} ({order}): " + "; ".join(parts) + "." + verdict)
    plain = [g for (_, t), g in gs.items() if t is None]
    if plain and all(
        _mean(g, f"tpr0.1/{m}/{a}") <= _band(g[0])["tpr"][0][1]
        for g in plain
        for m in ["victim"] + ([_strongest(g)] if _reconstructions(g[0]) else [])
        for a in lira
    ):
        out.append(
            "- So at which ε does the neighbour's TPR at 0.1 % FPR reach chance? Here it is "
            "within the null band already without DP, for every algorithm on this page and "
            "through the victim's model and the strongest reconstruction: under LiRA (offline "
            "and online) these models do not separate their members at a low FPR, so in this "
            "regime that ε is ∞ and the page can say nothing finer (privacy_attacks_overfit.md "
            "answers it where the models memorise)."
        )
    return out
