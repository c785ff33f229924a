"""The attack pages drawn from their rows: the protocol and setting in words, the tables
(`tables`), the answers computed from the rows (do low-rank messages leak less than full models;
at which epsilon the neighbour's TPR at a low FPR reaches chance), what was not reached, and the
network-DP section (`network`)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._markdown import block, fill, mean_sd, template
from experiments.pages._privacy import NONPRIVATE_LR

from . import runs
from .audit import audit_answers, audit_section
from .network import HEATMAP_PNG, network_text, plot_network
from .regimes import DP, OBSERVER, regime
from .tables import HEADLINE, _band, _last, _models, _reconstructions, _strongest
from .tables import all_attacks_table, budget_section, groups, label, leakage_table
from .tables import per_class_table, plot_roc, reconstruction_table, rounds_table, runs_table


def render(name: str, rows: Rows) -> Outputs:
    """The page of regime `name` from its rows (its fixed text: page.md beside this file): the
    attacked rows in the plan's (spec, target) order, seed by seed; the network section when the
    plan has one."""
    r, by = regime(name, rows.quick), rows.by_key
    network = by.get("network")
    order = [runs.key(s, t, seed) for g in r["groups"] for s, t in g for seed in r["seeds"]]
    data, missing = [by[k] for k in order if k in by], [k for k in order if k not in by]
    not_reached = list(r["not_reached"]) + [f"run missing: {m}" for m in missing]
    not_reached += [
        f"run failed: {x['spec']} ε {x['target']} seed {x['seed']}: {x['failure']}"
        for x in data
        if "failure" in x
    ]
    # older rows taken with --reuse (their origin), not the network row kept from an older page
    first = next((x for x in rows.records if x.key != "network"), None)
    others = ((first and first.origin) or {}).get("budget_rows")
    missed = "## Not reached\n\n" + "\n".join(f"- {x}" for x in not_reached) + "\n\n"
    text = fill(
        template(__file__),
        **intro_fields(r, rows, data),
        name=name,
        runs=block(runs_table(data) + "\n"),
        budget=block(budget_section(data, others) if others else ""),
        audit=block(audit_section(groups(data))),
        leakage=block(leakage_table(data) + "\n"),
        all_attacks=block(all_attacks_table(data) + "\n"),
        reconstruction=block(reconstruction_table(data) + "\n"),
        rounds=block(rounds_table(data) + "\n"),
        per_class=block(per_class_table(data) + "\n"),
        answers=answers(data),
        not_reached=block(missed if not_reached else ""),
        network=block(network_text(network) if network is not None else ""),
        network_data="; the network-DP matrices" if network is not None else "",
    )
    out: Outputs = {f"{name}.md": text, f"{name}_roc.png": plot_roc(data)}
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
    dp = setting.get("dp") or DP
    words = dict(batch=setting["batch_size"], lr=setting["lr"], epochs=setting["epochs"])
    words.update(dp_batch=dp.get("batch_size"), dp_lr=dp.get("lr"), dp_epochs=dp.get("epochs"))
    words.update(clip=dp.get("dp_max_grad_norm"), delta=dp.get("dp_delta"))
    regime_words = r["regime_text"].format(**words)
    per = nonmembers // 1000
    keys = ("dataset", "partition", "model", "topology", "momentum", "warmup_epochs")
    return dict(
        {k: setting[k] for k in keys},
        title=r["title"],
        made_by=made_by(rows),
        load=load if loads else "",
        observer=OBSERVER,
        members=members,
        nonmembers=nonmembers,
        per=per,
        plural="s" if per != 1 else "",
        seeds=len(r["seeds"]),
        references=r["references"],
        reference_words=r["reference_words"].format(
            reference_lr=setting.get("reference_lr", NONPRIVATE_LR)
        ),
        headline=HEADLINE,
        per_peer=len(split["record"]["members"]["0"]) if split else 0,
        victim_members=members // 2,
        regime_words=regime_words,
        scale_note=r["scale_note"],
    )


def _eps_text(e: float) -> str:
    return "∞" if math.isinf(e) else f"{e:g}"


def _mean(group, key) -> float:
    return statistics.fmean(_last(r)["flat"][key] for r in group)


def answers(rows) -> List[str]:
    """The page's two questions, answered from the rows (no number typed by hand)."""
    gs = {(g[0]["spec"], g[0]["target"]): g for g in groups(rows)}
    return low_rank_answers(gs) + chance_answers(gs) + audit_answers(list(gs.values()))


def low_rank_answers(gs) -> List[str]:
    """Do low-rank messages leak less than full models, at equal accuracy and bytes?"""
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
        (a_g, sd_g), (a_e, sd_e) = (mean_sd(r["acc_avg"] for r in x) for x in (g, exact))
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
                if abs(a_g - a_e) <= (sd_g or 0.0) + (sd_e or 0.0)
                else "not equal: more than the seeds' spread apart"
            )
            + f"), and the victim's own model gives {v_auc:.3f}. The observer received "
            f"{mb:.3g} MB against {r0['observed_mb']:.3g} MB; at the exact-gossip round closest to "
            f"equal bytes (step {step}, {r0['observed_mb'] * (step + 1) / r0['steps']:.3g} MB) "
            f"exact gossip's AUC is {at:.3f}."
        )
    return out


def _verdict(above, at_chance, aucs_by_eps, bands) -> str:
    """Where the TPR is above chance and where at it, and where the AUC is above its band."""
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
    return verdict


def chance_answers(gs) -> List[str]:
    """At which epsilon does the neighbour's TPR at 0.1 % FPR reach chance (the null band)?"""
    out, targets = [], sorted({t for (_, t) in gs if t is not None})
    lira = ("LiRA offline", "LiRA online")
    for spec in dict.fromkeys(s for (s, _) in gs):
        parts, above, at_chance, aucs_by_eps, bands = [], [], [], [], {}

        for t in targets + [None]:
            g = gs.get((spec, t))
            if g is None:
                continue
            band, key = _band(g[0]), math.inf if t is None else t
            tprs = [_mean(g, f"tpr0.1/{m}/{a}") for m in _models(g) for a in lira]
            aucs = [_mean(g, f"auc/{m}/{a}") for m in _models(g) for a in lira]
            chance = all(v <= band["tpr"][0][1] for v in tprs)
            aucs_by_eps.append((key, aucs))
            bands[key] = band["auc"][1]
            (at_chance if chance else above).append(key)
            acc = statistics.fmean(r["acc_avg"] for r in g)
            parts.append(
                f"ε {_eps_text(key)}: TPR @ 0.1 % FPR "
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
            verdict = _verdict(above, at_chance, aucs_by_eps, bands)
            out.append(f"- {label(spec)} ({order}): " + "; ".join(parts) + "." + verdict)
    plain = [g for (_, t), g in gs.items() if t is None]
    if plain and all(
        _mean(g, f"tpr0.1/{m}/{a}") <= _band(g[0])["tpr"][0][1]
        for g in plain
        for m in _models(g)
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
