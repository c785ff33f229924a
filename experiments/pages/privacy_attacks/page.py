"""The attack pages drawn from their rows: the protocol and setting in words, the tables
(`tables`), the answers computed from the rows (do low-rank messages leak less than full models;
at which epsilon the neighbour's TPR at a low FPR reaches chance), what was not reached, and the
network-DP section (`network`)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._privacy import NONPRIVATE_LR, budget_text

from . import runs
from .network import HEATMAP_PNG, network_text, plot_network
from .regimes import DP, OBSERVER, regime
from .tables import (
    HEADLINE,
    _band,
    _last,
    _reconstructions,
    _strongest,
    all_attacks_table,
    budget_section,
    groups,
    label,
    leakage_table,
    per_class_table,
    plot_roc,
    reconstruction_table,
    rounds_table,
    runs_table,
)


def regime_text(setting: Dict[str, Any], dp: Dict[str, Any]) -> str:
    """The default regime's sentences (privacy_dp_sweep.md's regime)."""
    return (
        f"Every row trains in the regime that privacy_dp_sweep.md chose (its constants are "
        f"imported, not copied) on the same data per peer. Non-private rows: that page's "
        f"non-private reference, batch {setting['batch_size']}, {setting['epochs']} epochs, but "
        f"lr {setting['lr']} (see Not reached). Private rows: DP-SGD on every peer, its chosen row "
        f"(Poisson batches of {dp.get('batch_size')}, lr {dp.get('lr')}, clip "
        f"C = {dp.get('dp_max_grad_norm')}, δ = {dp.get('dp_delta')}) trained for "
        f"{budget_text()} (privacy_dp_budget.md: at each ε the budget after which doubling the "
        "epochs no longer pays), "
    )


def render(name: str, rows: Rows) -> Outputs:
    """The page of regime `name` from its rows: the attacked rows in the plan's (spec, target)
    order, seed by seed; the network section when the plan has one."""
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
    text = intro(r, rows, data) + "## Runs\n\n" + runs_table(data) + "\n"
    others = (rows.records[0].origin or {}).get("budget_rows")
    if others:
        text += budget_section(data, others)
    text += (
        "## Leakage to the neighbour (last round)\n\nThe strongest reconstruction is the "
        "observer's estimator with the highest mean LiRA AUC (the oracle uses the truth and "
        "is a ceiling, not an attack).\n\n" + leakage_table(data) + "\n"
    )
    text += "All five attacks with the victim's own model:\n\n" + all_attacks_table(data) + "\n"
    text += f"![ROC, log scale]({name}_roc.png)\n\n"
    text += (
        "## Reconstructions, judged by what they enable\n\nEstimators "
        "(`gossip_powersgd.privacy.estimators`): PowerGossip — the moving-M least squares of "
        "`reconstruction.py` (last 4 messages), least squares on the difference D = M_victim − "
        "M_observer over the last 64 messages, its drift-aware variant (256 messages weighted "
        "0.97^age, each corrected by the observer's own model history), and the oracle: the "
        "true D projected on the span of every factor the observer saw (a ceiling); exact "
        "gossip: read off; Choco: its public copy x̂. Relative L2 error and agreement are means "
        "over the two victims.\n\n" + reconstruction_table(data) + "\n"
    )
    text += "## Attacks over rounds\n\n" + rounds_table(data) + "\n"
    text += "## Per-class AUC (diagnostic)\n\n" + per_class_table(data) + "\n"
    text += "## Answers\n\n" + "\n".join(answers(data)) + "\n\n"
    if not_reached:
        text += "## Not reached\n\n" + "\n".join(f"- {x}" for x in not_reached) + "\n\n"
    text += network_text(network) if network is not None else ""
    text += (
        f"Data: [{name}.jsonl]({name}.jsonl) (every row with every attack, round, evaluation, "
        "ROC, per-class AUC and the split's indices"
        + ("; the network-DP matrices" if network is not None else "")
        + ").\n"
    )
    out: Outputs = {f"{name}.md": text, f"{name}_roc.png": plot_roc(data)}
    if network is not None:
        out[HEATMAP_PNG] = plot_network(network)
    return out


def intro(r: Dict[str, Any], rows: Rows, data) -> str:
    """The title, who made the page, the threat model, the membership protocol and the setting."""
    setting, ok = r["setting"], [x for x in data if "failure" not in x]
    split = rows.by_key.get(f"split/seed{ok[0]['seed']}") if ok else None
    per_peer = len(split["record"]["members"]["0"]) if split else 0
    members, nonmembers = (ok[0]["members"], ok[0]["nonmembers"]) if ok else (0, 0)
    loads = [x["load"] for x in data if "load" in x]
    load = f" (1-min load average {min(loads):.1f}–{max(loads):.1f} at the ends of the runs)"
    dp = setting.get("dp") or DP
    words = dict(batch=setting["batch_size"], lr=setting["lr"], epochs=setting["epochs"])
    words.update(dp_batch=dp.get("batch_size"), dp_lr=dp.get("lr"), dp_epochs=dp.get("epochs"))
    words.update(clip=dp.get("dp_max_grad_norm"), delta=dp.get("dp_delta"))
    regime_words = (
        r["regime_text"].format(**words) if r["regime_text"] else regime_text(setting, dp)
    )
    per = nonmembers // 1000
    return (
        f"# {r['title']}\n\n{made_by(rows)} Backend `local` (every peer a thread of one "
        f"process), on 2 CPU cores shared with other engineers' jobs{load if loads else ''}.\n\n"
        "**Threat model.** Honest-but-curious peers: they follow the protocol, do not collude, "
        "and see exactly the bytes the transport delivers to them, plus what they legitimately "
        "know (their own model and data, the config and seed, the shared PowerGossip factors, "
        f"Choco's public copy x̂). Rank {OBSERVER} observes (records every message it receives, "
        "every step) and attacks both its neighbours (the victims), whose own models give the "
        "truth.\n\n"
        "**Membership protocol.** Before training each victim's shard is split at random "
        "(`gossip_powersgd.privacy.heldout.make_split`, seed = the run's seed; the indices are in "
        "the JSON) into members, which it trains on, and held-out records that no peer ever trains "
        "on (the split enters training as a `partition: local` dataset, so nothing else can be "
        "trained on). Members and non-members therefore come from the same distribution. Per run: "
        f"{members} members and {nonmembers} non-members pooled over the two victims, so TPR at "
        f"0.1 % FPR lets {per} non-member{'s' if per != 1 else ''} above the threshold (FPR in "
        f"steps of 1/{nonmembers}); every figure is mean ± sd over {len(r['seeds'])} seeds (a new "
        "split and a new training seed each). Blind baselines beside every figure: the "
        "class-prior score (the label's frequency in the victims' whole shards, members and "
        "held-out alike: never looks at a model) and the same attacks through a model that never "
        "saw the victims (trained in-process on the observer's own shard); both must sit in the "
        "null band, the central 95 % of AUC and TPR under 200 random permutations of the member "
        "labels. Attacks: LOSS; calibrated LOSS (−loss + the mean loss of the reference models "
        "that did not train on the candidate); class-conditional LOSS; LiRA offline and online "
        f"(Carlini et al. 2022) with {r['references']} reference models per seed trained "
        "in-process, each on a random half of the candidate pool (every candidate in exactly half "
        "of them) plus the observer's own shard, with the non-private recipe below but lr "
        f"{setting.get('reference_lr', NONPRIVATE_LR)} (each trains alone, without gossip; no DP "
        "for the reference models, also for the DP rows: a weaker but cheaper attacker), global "
        f"variance. The headline attack is {HEADLINE}.\n\n"
        f"**Setting and scale.** `{setting['dataset']}` ({per_peer} training samples per peer; "
        f"each victim trains on {members // 2} of them and holds the rest out), "
        f"`{setting['partition']}`, `{setting['model']}`, {setting['topology']}, SGD momentum "
        f"{setting['momentum']}, cosine schedule, {setting['warmup_epochs']} warm-up epoch. "
        f"{regime_words}noise secret per peer, one public σ for every peer, chosen so that the "
        "peer with the highest sampling rate (a victim: half a shard) ends at the target; the ε "
        f"in a row is each victim's own. Scale: {r['scale_note']}\n\n"
    )


def _eps_text(e: float) -> str:
    return "∞" if math.isinf(e) else f"{e:g}"


def _mean(group, key) -> float:
    return statistics.fmean(_last(r)["flat"][key] for r in group)


def answers(rows) -> List[str]:
    """The page's two questions, answered from the rows (no number typed by hand)."""
    gs = {(g[0]["spec"], g[0]["target"]): g for g in groups(rows)}
    return low_rank_answers(gs) + chance_answers(gs)


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
            verdict = _verdict(above, at_chance, aucs_by_eps, bands)
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
