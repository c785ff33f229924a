"""The privacy-attacks page from measured rows: tables of leakage (mean ± sd over seeds) with the
blind baselines and the null band beside every figure, reconstructions judged by the attacks
through them, attacks over rounds, per-class AUC, a log-scale ROC plot; the answers in words
(answers.py) and the network-DP section (network_page.py) placed on it."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .answers import answers
from .attacks import ATTACKS
from .dp_sweep import budget_text
from .measure import DP, OBSERVER
from .network_page import HEATMAP_PNG, network_text, plot_network
from .rows import (
    HEADLINE,
    _band,
    _last,
    _pyplot,
    _reconstructions,
    _stat,
    _strongest,
    band_of,
    budget_row,
    groups,
    label,
)

__all__ = ["HEATMAP_PNG", "answers", "band_of", "page", "plateau", "plot_network", "plot_roc"]


def roc_png(stem: str) -> str:
    """The ROC plot's file name for a page named `stem`."""
    return f"{stem}_roc.png"


ROC_PNG = roc_png("privacy_attacks")


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


_PRIORS: Dict[tuple, Dict[str, Any]] = {}


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


def budget_section(rows, others: Sequence[Dict[str, Any]]) -> str:
    """The DP rows of this page beside the same (algorithm, epsilon) at the previous page's
    budget (`others`, from `--reuse`): does the budget pay in this regime?"""
    mine = [budget_row(r) for r in rows if "failure" not in r and r["target"] is not None]
    cells = {(o["spec"], o["target"]) for o in others}
    by: Dict[tuple, Dict[int, List[Dict[str, Any]]]] = {}
    for r in [*others, *mine]:
        if (r["spec"], r["target"]) in cells:
            by.setdefault((r["spec"], r["target"]), {}).setdefault(r["epochs"], []).append(r)
    lines = [
        "## Training budget in this regime\n",
        "The DP rows above beside the same algorithm and ε at the previous page's budget (its "
        "rows, same setting and recipe but the number of epochs, taken with `--reuse`; each "
        "run's σ solved for its own steps). The victims here train on half a shard, so their σ "
        "at a target ε is that of a smaller ε on privacy_dp_budget.md's full shards, where "
        "the budget peaks earlier.\n",
        "| algorithm | target ε | epochs | seeds | σ | averaged-model acc | change from the "
        "shorter budget (pp) | LiRA offline AUC (victim's model) | TPR at 0.1 % FPR |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    pays, loses = [], []
    for (spec, target), budgets in by.items():
        means = {e: statistics.fmean(x["acc_avg"] for x in g) for e, g in budgets.items()}
        if len(means) >= 2:
            short, long = min(means), max(means)
            gain = 100 * (means[long] - means[short])
            where = f"{label(spec)} at ε = {target:g} ({gain:+.2f} pp from {short} to {long})"
            (pays if gain >= 0 else loses).append(where)
        for e in sorted(budgets):
            g = budgets[e]
            shorter = [b for b in means if b < e]
            change = f"{100 * (means[e] - means[max(shorter)]):+.2f}" if shorter else "—"
            lines.append(
                f"| {label(spec)} | {target:g} | {e} | {len(g)} | {g[0]['sigma']:.3g} | "
                f"{_stat([x['acc_avg'] for x in g], 2, pct=True)} % | {change} | "
                f"{_stat([x['auc'] for x in g])} | {_stat([x['tpr'] for x in g], 4)} |"
            )
    words = []
    if pays:
        words.append("The longer budget pays for " + "; ".join(pays) + ".")
    if loses:
        words.append(
            "It costs accuracy for "
            + "; ".join(loses)
            + ": in this regime their budget peaks at the shorter one or before, and their rows "
            "above are past it."
        )
    return "\n".join(lines) + "\n\n" + (" ".join(words) + "\n\n" if words else "")


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
    others = (plan.get("reused") or {}).get("budget_rows") or []
    if others:
        text += budget_section(rows, others)
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
