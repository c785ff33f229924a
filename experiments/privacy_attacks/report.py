"""The privacy-attacks page from measured rows: tables of leakage (mean ± sd over seeds) with the
blind baselines and the null band beside every figure, reconstructions judged by the attacks
through them, attacks over rounds, per-class AUC, a log-scale ROC plot; and the network-DP
section (heat maps)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .attacks import ATTACKS
from .measure import ALGORITHMS, DP, OBSERVER


def roc_png(stem: str) -> str:
    """The ROC plot's file name for a page named `stem`."""
    return f"{stem}_roc.png"


ROC_PNG = roc_png("privacy_attacks")

HEATMAP_PNG = "privacy_attacks_network_dp.png"
#: The attack the headline columns use (the strongest here on average; every attack is in the JSON).
HEADLINE = "LiRA offline"


def label(spec: str) -> str:
    return dict((s, name) for name, s in ALGORITHMS).get(spec, spec)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def groups(rows: Sequence[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """Rows of the same (algorithm, target epsilon), in plan order."""
    out: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        if "failure" not in r:
            out.setdefault((r["spec"], r["target"]), []).append(r)
    return list(out.values())


def _stat(values: Sequence[float], digits: int = 3, pct: bool = False) -> str:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return "n/a"
    scale = 100 if pct else 1
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def _last(r: Dict[str, Any]) -> Dict[str, Any]:
    return r["rounds"][str(r["last"])]


def _dp(group: Sequence[Dict[str, Any]]) -> str:
    r = group[0]
    if r["target"] is None:
        return "none"
    eps = [e for g in group for e in (g["eps_victims"] or [g["eps_max"]])]
    span = (
        f"{min(eps):.3g}"
        if f"{min(eps):.3g}" == f"{max(eps):.3g}"
        else f"{min(eps):.3g}–{max(eps):.3g}"
    )
    return f"ε = {span} (victims' own; target {r['target']:g})"


def _reconstructions(r: Dict[str, Any]) -> List[str]:
    return [k for k in _last(r)["quality"] if k != "observer's own"]


def _strongest(group: Sequence[Dict[str, Any]]) -> str:
    """The observer's estimator with the highest mean headline AUC (the oracle excluded: it uses
    the truth)."""
    names = [n for n in _reconstructions(group[0]) if not n.startswith("oracle")]
    return max(
        names,
        key=lambda n: statistics.fmean(_last(r)["flat"][f"auc/{n}/{HEADLINE}"] for r in group),
    )


_BANDS: Dict[tuple, Dict[str, list]] = {}
_PRIORS: Dict[tuple, Dict[str, Any]] = {}


def band_of(members: int, nonmembers: int) -> Dict[str, list]:
    """The permutation null band (`membership.null_band`) of a continuous score (no ties) for
    these counts: it depends on the counts only, so it is computed once from Gaussian scores."""
    import numpy as np

    from gossip_powersgd.privacy.membership import null_band

    key = (members, nonmembers)
    if key not in _BANDS:
        rng = np.random.default_rng(0)
        _BANDS[key] = null_band(
            rng.standard_normal(members), rng.standard_normal(nonmembers), permutations=400
        )
    return _BANDS[key]


def class_prior(r: Dict[str, Any]) -> Dict[str, Any]:
    """The blind class-prior score of the row's candidates: each label's frequency in the
    victims' whole shards (members and held-out alike: with as many of each, its AUC is 1/2 in
    expectation, where frequencies fitted on the members alone favour them)."""
    import numpy as np

    from gossip_powersgd.privacy.membership import attack_report, class_prior_scores
    from gossip_powersgd.training.data import load_dataset

    split = r["split"]
    key = (split["dataset"], split["seed"], split["split_seed"], tuple(split["victims"]))
    if key in _PRIORS:
        return _PRIORS[key]
    y = load_dataset(split["dataset"], split["seed"]).y_train.numpy()
    member, labels = [], []
    for v in split["victims"]:
        for inside in (True, False):
            index = split["members" if inside else "heldout"][str(v)]
            member += [inside] * len(index)
            labels.append(y[index])
    labels, member = np.concatenate(labels), np.array(member)
    scores = class_prior_scores(labels, labels, int(y.max()) + 1)
    rep = attack_report(scores[member], scores[~member])
    rep.pop("roc")
    _PRIORS[key] = rep
    return rep


def _band(r: Dict[str, Any]) -> Dict[str, list]:
    return band_of(r["members"], r["nonmembers"])


def _within(value: float, band: Sequence[float]) -> bool:
    return band[0] <= value <= band[1]


def blind_check(group: Sequence[Dict[str, Any]]) -> str:
    """How many seeds have both blind baselines inside the permutation null band: the class
    prior's AUC, and the blind model's AUC and TPR at 0.1 % and 1 % FPR (headline attack)."""
    ok = 0
    for r in group:
        e = _last(r)["evaluation"]
        band = _band(r)
        blind = e["blind_model"][HEADLINE]
        # The class prior takes ~10 values: no threshold has FPR <= 1 %, so only its AUC counts.
        ok += (
            _within(class_prior(r)["auc"], band["auc"])
            and _within(blind["auc"], band["auc"])
            and all(_within(t, b) for t, b in zip(blind["tpr"], band["tpr"]))
        )
    return f"{ok}/{len(group)}"


def _acc_at(r: Dict[str, Any], quarter: int) -> Optional[float]:
    """The averaged-model accuracy at the evaluation ending quarter `quarter` of the run."""
    for e in r.get("evals") or ():
        if round(4 * e["epoch"] / r["epochs"]) == quarter:
            return e["acc_avg"]
    return None


def plateau(group: Sequence[Dict[str, Any]]) -> tuple:
    """(accuracy at half the run, at three quarters, change over the last quarter in pp), each
    as mean ± sd over the group's seeds, "n/a" for rows evaluated only at their end."""
    half = [_acc_at(r, 2) for r in group]
    three = [_acc_at(r, 3) for r in group]
    change = [100 * (r["acc_avg"] - t) for r, t in zip(group, three) if t is not None]
    pct = [_stat(v, 2, True) for v in (half, three)]
    return tuple(v if v == "n/a" else v + " %" for v in pct) + (_stat(change, 2),)


def runs_table(rows) -> str:
    lines = [
        "| algorithm | DP | σ | seeds | averaged-model acc | victims' model acc | MB sent / peer | "
        "MB the observer received | consensus distance (end) | averaged-model acc at ½ / ¾ "
        "of the run | change over the last quarter (pp) | run s (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in groups(rows):
        half, three, change = plateau(g)
        lines.append(
            f"| {label(g[0]['spec'])} | {_dp(g)} | "
            f"{'—' if g[0]['sigma'] is None else format(g[0]['sigma'], '.3g')} | {len(g)} | "
            f"{_stat([r['acc_avg'] for r in g], 2, True)} % | "
            f"{_stat([r['acc_victim'] for r in g], 2, True)} % | "
            f"{g[0]['mb_sent_per_peer']:.3f} | {g[0]['observed_mb']:.3f} | "
            f"{_stat([r['consensus'] for r in g], 3)} | {half} / {three} | {change} | "
            f"{statistics.fmean(r['run_seconds'] for r in g):.0f} |"
        )
    return "\n".join(lines) + "\n"


def leakage_table(rows) -> str:
    lines = [
        "| algorithm | DP | model | LOSS AUC | LiRA offline AUC | LiRA online AUC | "
        "TPR @ 0.1 % FPR | TPR @ 1 % FPR | blind: class prior AUC | blind: model that never "
        "saw the victims, AUC / TPR @ 0.1 % | null band AUC / TPR @ 0.1 % / TPR @ 1 % | "
        "blind within band (seeds) |",
        "|---" * 12 + "|",
    ]
    for g in groups(rows):
        strongest = _strongest(g) if _reconstructions(g[0]) else None
        models = ["victim"] + (
            [strongest, "oracle: D on the span of all factors"]
            if strongest and "oracle: D on the span of all factors" in _reconstructions(g[0])
            else [strongest]
            if strongest
            else []
        )
        models += ["observer's own", "average of all"]
        band = _band(g[0])
        blind = (
            f"{_stat([class_prior(r)['auc'] for r in g])}",
            f"{_stat([_last(r)['flat'][f'auc/blind model/{HEADLINE}'] for r in g])} / "
            f"{_stat([_last(r)['flat'][f'tpr0.1/blind model/{HEADLINE}'] for r in g], 4)}",
            f"[{band['auc'][0]:.3f}, {band['auc'][1]:.3f}] / [{band['tpr'][0][0]:.4f}, "
            f"{band['tpr'][0][1]:.4f}] / [{band['tpr'][1][0]:.4f}, {band['tpr'][1][1]:.4f}]",
        )
        for name in models:
            f = [_last(r)["flat"] for r in g]
            title = name if name != strongest else f"strongest reconstruction: {name}"
            lines.append(
                f"| {label(g[0]['spec'])} | {_dp(g)} | {title} | "
                f"{_stat([x[f'auc/{name}/LOSS'] for x in f])} | "
                f"{_stat([x[f'auc/{name}/LiRA offline'] for x in f])} | "
                f"{_stat([x[f'auc/{name}/LiRA online'] for x in f])} | "
                f"{_stat([x[f'tpr0.1/{name}/{HEADLINE}'] for x in f], 4)} | "
                f"{_stat([x[f'tpr1/{name}/{HEADLINE}'] for x in f], 4)} | "
                f"{blind[0]} | {blind[1]} | {blind[2]} | {blind_check(g)} |"
            )
    return "\n".join(lines) + "\n"


def all_attacks_table(rows) -> str:
    lines = [
        "| algorithm | DP | " + " | ".join(f"{a} AUC (victim's model)" for a in ATTACKS) + " |",
        "|---" * (2 + len(ATTACKS)) + "|",
    ]
    for g in groups(rows):
        cells = " | ".join(_stat([_last(r)["flat"][f"auc/victim/{a}"] for r in g]) for a in ATTACKS)
        lines.append(f"| {label(g[0]['spec'])} | {_dp(g)} | {cells} |")
    return "\n".join(lines) + "\n"


def reconstruction_table(rows) -> str:
    lines = [
        "| algorithm | DP | estimate of the victim's model | relative L2 error | prediction "
        "agreement with the victim's model (test set) | LiRA offline AUC through it | TPR @ "
        "1 % FPR | the victim's own model: AUC / TPR @ 1 % |",
        "|---" * 8 + "|",
    ]
    for g in groups(rows):
        own = (
            f"{_stat([_last(r)['flat'][f'auc/victim/{HEADLINE}'] for r in g])} / "
            f"{_stat([_last(r)['flat'][f'tpr1/victim/{HEADLINE}'] for r in g], 4)}"
        )
        for name in _reconstructions(g[0]) + ["observer's own"]:
            q = [_last(r)["quality"][name] for r in g]
            f = [_last(r)["flat"] for r in g]
            lines.append(
                f"| {label(g[0]['spec'])} | {_dp(g)} | {name} | "
                f"{_stat([x['l2'] for x in q], 4)} | {_stat([x['agreement'] for x in q], 2, True)} % | "
                f"{_stat([x[f'auc/{name}/{HEADLINE}'] for x in f])} | "
                f"{_stat([x[f'tpr1/{name}/{HEADLINE}'] for x in f], 4)} | {own} |"
            )
    return "\n".join(lines) + "\n"


def rounds_table(rows) -> str:
    lines = [
        "| algorithm | DP | model | " + "LiRA offline AUC at round (share of the run; MB the "
        "observer had received): 25 % | 50 % | 75 % | 100 % |",
        "|---" * 7 + "|",
    ]
    for g in groups(rows):
        r0 = g[0]
        steps = r0["round_steps"]
        names = ["victim"] + ([_strongest(g)] if _reconstructions(r0) else [])
        for name in names:
            cells = []
            for s in steps:
                values = [r["rounds"][str(s)]["flat"].get(f"auc/{name}/{HEADLINE}") for r in g]
                mb = r0["observed_mb"] * (s + 1) / r0["steps"]
                cells.append(f"{_stat(values)} ({mb:.3g} MB)")
            lines.append(f"| {label(r0['spec'])} | {_dp(g)} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def per_class_table(rows) -> str:
    lines = [
        "| algorithm | DP | per-class LiRA offline AUC, victim's model (classes 0–9, mean "
        "over seeds) |",
        "|---|---|---|",
    ]
    for g in groups(rows):
        per = [r["rounds"][str(r["last"])]["per_class_victim"] for r in g]
        mean = [statistics.fmean(col) for col in zip(*per)]
        lines.append(
            f"| {label(g[0]['spec'])} | {_dp(g)} | " + ", ".join(f"{v:.3f}" for v in mean) + " |"
        )
    return "\n".join(lines) + "\n"


def plot_roc(rows, path: Path) -> None:
    """Log-log ROC of the headline attack, seed of each group's first row: the victim's model and
    the strongest reconstruction, the blind model, chance."""
    plt = _pyplot()
    gs = groups(rows)
    fig, axes = plt.subplots(1, len(gs), figsize=(3.6 * len(gs), 3.6), squeeze=False)
    for ax, g in zip(axes.flat, gs):
        e = _last(g[0])["evaluation"]
        names = ["victim"] + ([_strongest(g)] if _reconstructions(g[0]) else [])
        for name, style in zip(names, ("-", "--")):
            fpr, tpr = e["models"][name][HEADLINE]["roc"]
            ax.plot(
                [max(v, 1e-4) for v in fpr],
                [max(v, 1e-4) for v in tpr],
                style,
                label="victim" if name == "victim" else "reconstruction",
            )
        ax.plot([1e-4, 1], [1e-4, 1], ":", color="grey", label="chance")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1e-4, 1)
        ax.set_ylim(1e-4, 1)
        ax.set_title(
            f"{label(g[0]['spec'])}, {'no DP' if g[0]['target'] is None else 'DP'}", fontsize=8
        )
        ax.set_xlabel("FPR")
        ax.set_ylabel("TPR")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


NOISE_TEXT = {"once": "once", "every_step": "every step"}


def network_table(network: Dict[str, Any]) -> str:
    lines = [
        "| noise | steps | topology | ε min | ε median | ε max | pairs at the local-DP ceiling "
        "| local-DP ceiling | Muffliato's per-message sum (not a bound): min – max; pairs below "
        "the exact ε; pairs above the ceiling |",
        "|---" * 9 + "|",
    ]
    for c in network["cases"]:
        summed = (
            f"{c['per_message_min']:.3g} – {c['per_message_max']:.3g}; "
            f"{100 * c['per_message_below_exact']:.0f} %; "
            f"{100 * c['per_message_above_local']:.0f} %"
            if "per_message_min" in c
            else "n/a"
        )
        lines.append(
            f"| {NOISE_TEXT[c['noise']]} | {c['steps']} | {c['topology']} | {c['min']:.3g} "
            f"| {c['median']:.3g} | {c['max']:.3g} | {100 * c['at_local']:.0f} % "
            f"| {c['local']:.3g} | {summed} |"
        )
    return "\n".join(lines) + "\n"


def network_text(network: Dict[str, Any]) -> str:
    """The network-DP section: what is computed, the table and the heat maps."""
    made = f"{network['generated']} " if network.get("generated") else ""
    return (
        f"## Pairwise network DP of noisy exact gossip (exact accountant)\n\n{made}"
        f"ε[u, v] of peer u towards observer v's whole view (everything v receives over the "
        f"run, its own values known), σ = {network['sigma']:g}, δ = {network['delta']:g}, "
        f"sensitivity 1. For linear gossip with Gaussian noise the view is one Gaussian "
        f"mechanism, so ε is exact (`gossip_powersgd.privacy.pairwise_epsilon`, analytic "
        f"Gaussian conversion). Noise once: each peer noises its value once, then gossip runs "
        f"(the Muffliato consensus setting); every step: fresh noise on each step's "
        f"contribution, any per-step change of norm ≤ 1 (as DP-SGD's clipped gradients), "
        f"the contributions taken as given (non-adaptive). The local-DP ceiling is what the "
        f"peer's own noisy values reveal (every step: all of them). Muffliato's per-message "
        f"sum composes every message as if it carried fresh noise (the previous version of "
        f"this table, here with the same conversion): it is not a bound (last column). "
        f"Linear gossip only: it does not cover PowerGossip's or compressed gossip's messages, "
        f"which per-peer DP-SGD covers by post-processing.\n\n"
        + network_table(network)
        + f"\n![network DP]({HEATMAP_PNG})\n\n"
    )


def plot_network(network: Dict[str, Any], path: Path) -> None:
    """epsilon[u, v] heat maps on one colour scale (log), one row per case, one column per
    topology; white: epsilon = 0 (u's noise does not reach v)."""
    import numpy as np
    from matplotlib.colors import LogNorm

    plt = _pyplot()
    cases = network["cases"]
    specs = list(dict.fromkeys(c["topology"] for c in cases))
    rows = list(dict.fromkeys((c["noise"], c["steps"]) for c in cases))
    mats = [np.array(c["matrix"]) for c in cases]
    finite = np.concatenate([m[np.isfinite(m) & (m > 0)] for m in mats])
    norm = LogNorm(vmin=finite.min(), vmax=finite.max())
    fig, axes = plt.subplots(
        len(rows), len(specs), figsize=(4.2 * len(specs), 3.8 * len(rows)), squeeze=False
    )
    for c, m in zip(cases, mats):
        ax = axes[rows.index((c["noise"], c["steps"])), specs.index(c["topology"])]
        image = ax.imshow(np.where(m > 0, m, np.nan), norm=norm, cmap="viridis")
        ax.set_title(
            f"{c['topology']}, noise {NOISE_TEXT[c['noise']]}, T = {c['steps']}", fontsize=9
        )
        ax.set_xlabel("observer v")
        if specs.index(c["topology"]) == 0:
            ax.set_ylabel("peer u")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="ε of u towards v")
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def regime_text(setting: Dict[str, Any], dp: Dict[str, Any]) -> str:
    """The default regime's sentences (privacy_dp_sweep.md's regime)."""
    return (
        f"Every row trains in the regime that privacy_dp_sweep.md chose (its constants are "
        f"imported, not copied) on the same data per peer. Non-private rows: that page's "
        f"non-private reference, batch {setting['batch_size']}, {setting['epochs']} epochs, but "
        f"lr {setting['lr']} (see Not reached). Private rows: DP-SGD on every peer, its chosen row "
        f"(Poisson batches of {dp.get('batch_size')}, lr {dp.get('lr')}, clip "
        f"C = {dp.get('dp_max_grad_norm')}, {dp.get('epochs')} epochs, δ = {dp.get('dp_delta')}), "
    )


def page(
    rows,
    network: Optional[Dict[str, Any]],
    plan: Dict[str, Any],
    generated: str,
    stem: str = "privacy_attacks",
) -> str:
    """The page; `stem` names its JSON and ROC plot (privacy_attacks for the default regime),
    `plan["title"]` and `plan["regime_text"]` a regime other than the default, `network` None
    leaves the network-DP section out."""
    setting = plan["setting"]
    text = f"# {plan.get('title', 'What a curious neighbour learns')}\n\n"
    loads = [r["load"] for r in rows if "load" in r]
    load = (
        f" (1-min load average {min(loads):.1f}–{max(loads):.1f} at the ends of the runs)"
        if loads
        else ""
    )
    text += (
        f"{generated} Backend `local` (every peer a thread of one process), on 2 CPU cores "
        f"shared with other engineers' jobs{load}.\n\n"
    )
    text += (
        "**Threat model.** Honest-but-curious peers: they follow the protocol, do not collude, "
        "and see exactly the bytes the transport delivers to them, plus what they legitimately "
        "know (their own model and data, the config and seed, the shared PowerGossip factors, "
        "Choco's public copy x̂). Rank "
        f"{OBSERVER} observes (records every message it receives, every step) and attacks both "
        f"its neighbours (the victims), whose own models give the truth.\n\n"
    )
    dp = setting.get("dp") or DP
    text += (
        f"**Membership protocol.** Before training each victim's shard is split at random "
        f"(`gossip_powersgd.privacy.heldout.make_split`, seed = the run's seed; the indices are in "
        f"the JSON) into members, which it trains on, and held-out records that no peer ever trains "
        f"on (the split enters training as a `partition: local` dataset, so nothing else can be "
        f"trained on). Members and non-members therefore come from the same distribution. Per run: "
        f"{plan['members']} members and {plan['nonmembers']} non-members pooled over the two "
        f"victims, so TPR at 0.1 % FPR lets {plan['nonmembers'] // 1000} "
        f"non-member{'s' if plan['nonmembers'] // 1000 != 1 else ''} above the "
        f"threshold (FPR in steps of 1/{plan['nonmembers']}); every figure is mean "
        f"± sd over {plan['seeds']} seeds (a new split and a new training seed each). Blind "
        f"baselines beside every figure: the class-prior score (the label's frequency in the "
        f"victims' whole shards, members and held-out alike: never looks at a model) and the same attacks through a model that never "
        f"saw the victims (trained in-process on the observer's own shard); both must sit in the "
        f"null band, the central 95 % of AUC and TPR under 200 random permutations of the member "
        f"labels. Attacks: LOSS; calibrated LOSS (−loss + the mean loss of the reference models "
        f"that did not train on the candidate); class-conditional LOSS; LiRA offline and online "
        f"(Carlini et al. 2022) with {plan['references']} reference models per seed trained "
        f"in-process, each on a random half of the candidate pool (every candidate in exactly half "
        f"of them) plus the observer's own shard, with the non-private recipe below but lr "
        f"{plan.get('reference_lr', setting['lr'])} (each trains alone, without gossip; no DP for the "
        f"reference models, also for the DP rows: a weaker but cheaper attacker), global variance. "
        f"The headline attack is {HEADLINE}.\n\n"
        f"**Setting and scale.** `{setting['dataset']}` ({plan['per_peer']} training samples per "
        f"peer; each victim trains on {plan['members'] // 2} of them and holds the rest out), "
        f"`{setting['partition']}`, `{setting['model']}`, {setting['topology']}, SGD momentum "
        f"{setting['momentum']}, cosine schedule, {setting['warmup_epochs']} warm-up epoch. "
        + (plan.get("regime_text") or regime_text(setting, dp))
        + f"noise secret per peer, one public σ for every peer, chosen so that the peer with the "
        f"highest sampling rate (a victim: half a shard) ends at the target; the ε in a row is "
        f"each victim's own. Scale: {plan['scale_note']}\n\n"
    )
    text += "## Runs\n\n" + runs_table(rows) + "\n"
    text += (
        "## Leakage to the neighbour (last round)\n\nThe strongest reconstruction is the "
        "observer's estimator with the highest mean LiRA AUC (the oracle uses the truth and "
        "is a ceiling, not an attack).\n\n" + leakage_table(rows) + "\n"
    )
    text += "All five attacks with the victim's own model:\n\n" + all_attacks_table(rows) + "\n"
    text += f"![ROC, log scale]({roc_png(stem)})\n\n"
    text += (
        "## Reconstructions, judged by what they enable\n\nEstimators "
        "(`gossip_powersgd.privacy.estimators`): PowerGossip — the moving-M least squares of "
        "`reconstruction.py` (last 4 messages), least squares on the difference D = M_victim − "
        "M_observer over the last 64 messages, its drift-aware variant (256 messages weighted "
        "0.97^age, each corrected by the observer's own model history), and the oracle: the "
        "true D projected on the span of every factor the observer saw (a ceiling); exact "
        "gossip: read off; Choco: its public copy x̂. Relative L2 error and agreement are means "
        "over the two victims.\n\n" + reconstruction_table(rows) + "\n"
    )
    text += "## Attacks over rounds\n\n" + rounds_table(rows) + "\n"
    text += "## Per-class AUC (diagnostic)\n\n" + per_class_table(rows) + "\n"
    text += "## Answers\n\n" + "\n".join(answers(rows)) + "\n\n"
    if plan.get("not_reached"):
        text += "## Not reached\n\n" + "\n".join(f"- {x}" for x in plan["not_reached"]) + "\n\n"
    if network is not None:
        text += network_text(network)
    text += (
        f"Data: [{stem}.json]({stem}.json) (every row with every attack, round, evaluation, "
        "ROC, per-class AUC and the split's indices"
        + ("; the network-DP matrices" if network is not None else "")
        + ").\n"
    )
    return text
