"""The attack pages drawn from their rows (fixed text: page.md, words.md): the tables (`tables`),
the answers computed from the rows, what was not reached, and the network-DP section (`network`)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._markdown import block, fill, mean_sd, template
from experiments.pages._privacy import NONPRIVATE_LR

from . import runs, tables

from .network import HEATMAP_PNG, network_text, plot_network
from .regimes import OBSERVER, regime
from .tables import HEADLINE, WORDS, _band, _flats, _models, _reconstructions, groups, label
from .tables import audit_answers, audit_section

LIRA = ("LiRA offline", "LiRA online")
#: The tables of the page, each `tables.NAME_table` (their headers: page.md).
TABLES = ("runs", "leakage", "all_attacks", "reconstruction", "rounds", "per_class")
#: The figures the low-rank answer quotes: the AUC and the TPR at 1 % FPR.
AT = (("auc", ""), ("tpr", "1"))


def render(name: str, rows: Rows) -> Outputs:
    """The page of regime `name`: attacked rows in plan order, the network section if planned."""
    r, by = regime(name, rows.quick), rows.by_key
    network = by.get("network")
    order = [runs.key(s, t, seed) for g in r["groups"] for s, t in g for seed in r["seeds"]]
    data = [by[k] for k in order if k in by]
    not_reached = list(r["not_reached"]) + [f"run missing: {k}" for k in order if k not in by]
    not_reached += [WORDS["failed"].format(**x) for x in data if "failure" in x]
    missed = "## Not reached\n\n" + "\n".join(f"- {x}" for x in not_reached) + "\n\n"
    fields = dict(intro_fields(r, rows, data), name=name, answers=answers(data))
    fields.update({k: getattr(tables, f"{k}_table")(data) for k in TABLES})
    fields["audit"] = block(audit_section(groups(data)))
    fields["not_reached"] = block(missed if not_reached else "")
    fields["network"] = block(network_text(network) if network is not None else "")
    fields["network_data"] = "; the network-DP matrices" if network is not None else ""
    text = fill(template(__file__), **fields)
    out: Outputs = {f"{name}.md": text, f"{name}_roc.png": tables.plot_roc(data)}
    if network is not None:
        out[HEATMAP_PNG] = plot_network(network)
    return out


def intro_fields(r: Dict[str, Any], rows: Rows, data) -> Dict[str, Any]:
    """What the title, the threat model, the membership protocol and the setting say."""
    setting, ok = r["setting"], [x for x in data if "failure" not in x]
    split = rows.by_key.get(f"split/seed{ok[0]['seed']}") if ok else None
    members, nonmembers = (ok[0]["members"], ok[0]["nonmembers"]) if ok else (0, 0)
    loads = [x["load"] for x in data if "load" in x]
    load = f" (1-min load average {min(loads):.1f}–{max(loads):.1f} at the ends of the runs)"
    out = dict(r=r, s=setting, made_by=made_by(rows), load=load if loads else "", observer=OBSERVER)
    out.update(members=members, nonmembers=nonmembers, per=nonmembers // 1000, headline=HEADLINE)
    out.update(plural="s" if nonmembers // 1000 != 1 else "", seeds=len(r["seeds"]))
    lr = setting.get("reference_lr", NONPRIVATE_LR)
    out["reference_words"] = r["reference_words"].format(reference_lr=lr)
    out["per_peer"] = len(split["record"]["members"]["0"]) if split else 0
    regime_words = r["regime_text"].format(s=setting, dp=setting["dp"])
    return dict(out, victim_members=members // 2, regime_words=regime_words)


def _eps_text(e: float) -> str:
    return "∞" if math.isinf(e) else f"{e:g}"


def _mean(group, key) -> float:
    return statistics.fmean(_flats(group, key))


def answers(rows) -> List[str]:
    """The page's two questions, answered from the rows (no number typed by hand)."""
    gs = {(g[0]["spec"], g[0]["target"]): g for g in groups(rows)}
    return low_rank_answers(gs) + chance_answers(gs) + audit_answers(list(gs.values()))


def low_rank_answers(gs) -> List[str]:
    """Do low-rank messages leak less than full models, at equal accuracy and bytes?"""
    out, exact = [], gs.get(("exact", None))
    for spec in ("powergossip:rank=1", "powergossip:rank=4", "choco:compressor=sign,gamma=1.0"):
        g = gs.get((spec, None))
        if exact is None or g is None:
            continue
        best, r0, mb = tables._strongest(g), exact[0], g[0]["observed_mb"]
        (a_g, sd_g), (a_e, sd_e) = (mean_sd(r["acc_avg"] for r in x) for x in (g, exact))
        apart = abs(a_g - a_e) > (sd_g or 0.0) + (sd_e or 0.0)

        def mb_at(s):  # what the observer had received of exact gossip by step s
            return r0["observed_mb"] * (s + 1) / r0["steps"]

        step = min(r0["round_steps"], key=lambda s: abs(mb_at(s) - mb))
        at = statistics.fmean(
            r["rounds"][str(step)]["flat"][f"auc/victim/{HEADLINE}"] for r in exact
        )
        v = dict(label=label(spec), best=best, headline=HEADLINE, mb=mb, e_mb=r0["observed_mb"])
        for x, group, model in (("c", g, best), ("e", exact, "victim"), ("v", g, "victim")):
            v.update({f"{x}_{m}": _mean(group, f"{m}{k}/{model}/{HEADLINE}") for m, k in AT})
        v.update(a_g=100 * a_g, a_e=100 * a_e, step=step, at_mb=mb_at(step), at=at)
        out.append(WORDS["low_rank"].format(**v, equal=WORDS["apart" if apart else "equal"]))
    return out


def _verdict(above, at_chance, aucs) -> str:
    """Where the TPR is above chance or at it, and where all four AUCs are above the band."""
    verdict = ""
    if above and at_chance:
        high = min(above)
        low = max((e for e in at_chance if e < high), default=None)
        verdict = " TPR above chance " + (
            "only without DP" if math.isinf(high) else f"at ε ≥ {_eps_text(high)}"
        )
        verdict += f", at chance at every ε ≤ {_eps_text(low)}" if low is not None else ""
        if any(e > high for e in at_chance):
            verdict += " (not monotone in ε: a chance row above an above-chance one)"
        verdict += "."
    auc_above = [e for e, a, hi in aucs if min(a) > hi]
    if len(aucs) > 1:
        where = "ε = " + ", ".join(_eps_text(e) for e in auc_above) if auc_above else "no ε tried"
        everywhere = len(auc_above) == len(aucs)
        verdict += (
            f" All four AUCs are above the null band at {'every ε tried' if everywhere else where}."
        )
    return verdict


def chance_answers(gs) -> List[str]:
    """At which epsilon does the neighbour's TPR at 0.1 % FPR reach chance (the null band)?"""
    out = []
    targets = sorted({t for (_, t) in gs if t is not None})
    plain = []
    for spec in dict.fromkeys(s for (s, _) in gs):
        parts, above, at_chance, aucs = [], [], [], []
        for g in (gs[(spec, t)] for t in targets + [None] if (spec, t) in gs):
            band = _band(g[0])
            t = g[0]["target"]
            key = math.inf if t is None else t
            tprs = [_mean(g, f"tpr0.1/{m}/{a}") for m in _models(g) for a in LIRA]
            four = [_mean(g, f"auc/{m}/{a}") for m in _models(g) for a in LIRA]
            aucs.append((key, four, band["auc"][1]))
            chance = all(v <= band["tpr"][0][1] for v in tprs)
            (at_chance if chance else above).append(key)
            plain += [chance] if t is None else []
            v = dict(eps=_eps_text(key), tpr_hi=band["tpr"][0][1], auc_hi=band["auc"][1])
            v.update(tprs=" / ".join(f"{x:.4f}" for x in tprs), chance=WORDS[f"chance {chance}"])
            v.update(aucs=" / ".join(f"{x:.3f}" for x in four))
            v["acc"] = 100 * statistics.fmean(r["acc_avg"] for r in g)
            parts.append(WORDS["chance_part"].format(**v))
        if parts:
            first = gs[next(k for k in gs if k[0] == spec)][0]
            through = WORDS[f"through {bool(_reconstructions(first))}"]
            v = dict(label=label(spec), through=through, parts="; ".join(parts))
            out.append(WORDS["chance"].format(**v, verdict=_verdict(above, at_chance, aucs)))
    return out + ([WORDS["never"]] if plain and all(plain) else [])
