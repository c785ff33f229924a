"""The markdown of experiments/results/privacy_mechanisms.md, from the runs' rows and the
calibration (`experiments.privacy_mechanisms`); every number comes from those."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List

NAMES = {
    "none": "non-private",
    "local": "local DP-SGD",
    "muffliato": "Muffliato",
    "zipdl": "ZIP-DL",
    "decor": "DECOR",
}


def _group(rows, mechanism, algorithm) -> List[Dict[str, Any]]:
    source = (
        "local"
        if mechanism == "muffliato" and not any(r["mechanism"] == "muffliato" for r in rows)
        else mechanism
    )
    return [r for r in rows if r["mechanism"] == source and r["algorithm"] == algorithm]


def _mean(values) -> float:
    return statistics.fmean(values)


def render_page(sections, generated, command, c, pm) -> str:
    algorithms = c["algorithms"]
    first = sections[0]
    setting = first["setting"]
    any_noise = next(iter(first["noises"].values()))
    q, steps = any_noise["q"], any_noise["steps"]
    names = [s["setting"]["topology"] for s in sections]
    schedule = setting.get("schedule", "constant")
    lr_text = (
        f"constant lr {setting['lr']}, no weight decay: the setting Muffliato's network "
        "accountant models"
        if schedule == "constant"
        else f"lr {setting['lr']} with a {schedule} decay to 0 over the run, no weight decay; "
        "Muffliato's and ZIP-DL's network accountants model a constant lr, so here they report "
        "DP-SGD's local bound, which holds under any schedule"
    )
    non_private_seeds = sorted({r["seed"] for r in first["rows"] if r["mechanism"] == "none"})
    lines = [
        "# Privacy mechanisms that use the graph: accuracy and the neighbour's attack at equal ε "
        "against a neighbour",
        "",
        f"{generated} Backend `local` (every peer a thread of one process) on a machine of 2 "
        f"cores, {_how_run(c)}.",
        "",
        "## Setting, and why this scale",
        "",
        f"Topologies {', '.join(names)}; dataset `synthetic_logreg` (d = 20, "
        f"{setting['dataset'].split('classes=')[1].split(',')[0]} classes, iid), model "
        f"`{setting['model']}`. Every peer's shard holds {2 * setting['shard']} records, split at "
        f"random (`privacy/heldout.py`, per seed) into {setting['shard']} members it trains on and "
        f"{setting['shard']} held-out records no peer trains on (Privacy IV's protocol). Plain "
        f"SGD (momentum 0, {lr_text}), expected batch {setting['batch_size']} (Poisson sampling, "
        f"q = {q:g}), {setting['epochs']} epochs = {steps} steps, clipping C = {c['clip']:g}, "
        f"δ = {c['delta']:g}, seeds {', '.join(map(str, setting['seeds']))} (non-private: seed"
        f"{'s' if len(non_private_seeds) > 1 else ''} {', '.join(map(str, non_private_seeds))}). "
        "Every mechanism's noise is on the clipped gradient sum, so on the model it scales with "
        "the step's lr exactly as a record's sensitivity lr_t C / batch does: the ε below does "
        f"not depend on the schedule. **A small linear problem, on purpose**: {len(sections)} "
        f"topologies × four mechanisms × two algorithms × {len(setting['seeds'])} seeds, each run "
        f"attacked, fit in {_runs_text(len(c['load']))} of this "
        f"command on 2 shared cores (measured here: {c['per_step']:.3g} s of wall time per step, "
        "set-up, evaluation and attack included, on average over all runs); the non-private rows "
        "are its ceiling. mnist1d / cnn1d at this breadth does not fit that budget and is not "
        "done here. Each run is evaluated at every quarter of the run: the plateau check below.",
        "",
        f"Target: **ε = {c['target']:g} against a direct neighbour** (victim 1, observer "
        f"{c['observer']}; every topology here is vertex transitive), each mechanism's noise "
        "solved for it, per topology, before any run, with its own accountant; ε against the "
        "most distant peer (most hops from the observer) is what that noise gives.",
        "",
        "## Calibration",
        "",
        "| topology | mechanism | DP-SGD σ (DECOR: σ_ind) | extra noise | ε vs neighbour (RDP) | "
        "ε vs neighbour (PLD, dp-accounting) | ε vs most distant peer | ε vs a peer knowing "
        "everything it can | accountant |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for section in sections:
        for name in ("local", "muffliato", "zipdl", "decor"):
            n = section["noises"][name]
            lines.append(
                f"| {section['setting']['topology']} | {NAMES[name]} | {n['sigma']:.4g} | "
                f"{n['extra']} | {n['neighbour']:.3g} | {n['neighbour_pld']:.3g} | "
                f"{n['far']:.3g} (peer {n['far_peer']}) | {n['local']:.3g} | {n['note']} |"
            )
    lines += [
        "",
        "## Results",
        "",
        "Averaged-model test accuracy at half, three quarters and the end of the run (mean ± std "
        "over the seeds), its change over the last quarter, local models' accuracy at the end, "
        "and the bytes each peer sent.",
        "",
        "| topology | mechanism | algorithm | seeds | acc at 1/2 | acc at 3/4 | acc at end | "
        "last-quarter change (pp) | local acc mean | local acc min | MB sent / peer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    tables: Dict[str, Dict[tuple, List[float]]] = {}
    plateau: Dict[str, List[tuple]] = {}
    for section in sections:
        topology, rows = section["setting"]["topology"], section["rows"]
        table = tables[topology] = {}
        plateau[topology] = []
        for name in ("none", "local", "muffliato", "zipdl", "decor"):
            for algorithm in algorithms:
                group = _group(rows, name, algorithm)
                if not group:
                    continue
                acc = [r["acc_avg"] for r in group]
                half = [r["acc_half"] for r in group]
                late = [r["acc_3q"] for r in group]
                change = [(a - h) * 100 for a, h in zip(acc, late)]
                table[(name, algorithm)] = acc
                if name != "none" and not (name == "muffliato" and section["reuse_muffliato"]):
                    plateau[topology].append((name, algorithm, _mean(change), _sd(acc) * 100))
                label = NAMES[name] + (
                    " (= local DP-SGD's runs)"
                    if name == "muffliato" and section["reuse_muffliato"]
                    else ""
                )
                lines.append(
                    f"| {topology} | {label} | {algorithm} | {len(group)} | {pm(half)} | "
                    f"{pm(late)} | {pm(acc)} | {_mean(change):+.2f} | "
                    f"{pm([r['acc_local_mean'] for r in group])} | "
                    f"{pm([r['acc_local_min'] for r in group])} | "
                    f"{_mean(r['mb_per_peer'] for r in group):.3f} |"
                )
    decaying = setting.get("schedule", "constant") != "constant"
    lines += ["", "## Trained to a plateau?", ""]
    if decaying:
        lines.append(
            f"Under the {setting['schedule']} schedule the learning rate falls to 0 over the last "
            "quarter, and the averaged model's accuracy can rise there however long the run: the "
            "change within a run is no plateau test, so none is drawn from it here. The test is "
            "the same plan at other budgets, each with its noise solved again for the target: "
            "[privacy_mechanisms_budget.md](privacy_mechanisms_budget.md) "
            "(`python -m experiments.privacy_mechanisms_budget`). The change within this run, "
            "for the record:"
        )
    else:
        lines.append(
            "At a constant lr a run that still rises over its last quarter by more than its "
            "seeds' spread has not reached its plateau; one that does not is on a plateau at this "
            "measure. The same plan at other budgets: "
            "[privacy_mechanisms_budget.md](privacy_mechanisms_budget.md) "
            "(`python -m experiments.privacy_mechanisms_budget`)."
        )
    lines.append("")
    section_epochs = {s["setting"]["topology"]: s["setting"]["epochs"] for s in sections}
    for topology, entries in plateau.items():
        rising = [e for e in entries if e[2] > max(e[3], 1e-12)]
        biggest = max(entries, key=lambda e: e[2])
        listed = "; ".join(f"{NAMES[n]} {a} {d:+.2f} pp vs std {sd:.2f}" for n, a, d, sd in rising)
        if decaying:
            verdict = (
                f"{len(rising)} of {len(entries)} rows rise by more than their seeds' spread "
                f"({listed})."
                if rising
                else "none rises by more than its seeds' spread."
            )
        elif not rising:
            verdict = (
                "every one within the seeds' spread of its row (std of the final accuracy): "
                "on a plateau at this measure."
            )
        else:
            verdict = (
                f"{len(rising)} of {len(entries)} rows still rise by more than their seeds' "
                f"spread ({listed}): after {section_epochs[topology]} epochs those rows are "
                "**not** shown at a plateau (a longer run: `--epochs`)."
            )
        lines.append(
            f"- **{topology}**: change over the last quarter "
            f"(epoch {3 * section_epochs[topology] // 4} to {section_epochs[topology]}) of the "
            "private rows: "
            f"{min(e[2] for e in entries):+.2f} to {biggest[2]:+.2f} pp (largest: "
            f"{NAMES[biggest[0]]}, {biggest[1]}); " + verdict
        )
    lines += attack_lines(sections, c)
    lines += ["", "## Answers, in numbers", ""]
    private = ("local", "muffliato", "zipdl", "decor")
    for section in sections:
        topology = section["setting"]["topology"]
        table = tables[topology]
        for algorithm in algorithms:
            ranked = sorted(private, key=lambda m: -_mean(table[(m, algorithm)]))
            best, second = ranked[0], ranked[1]
            gap = (_mean(table[(best, algorithm)]) - _mean(table[(second, algorithm)])) * 100
            spread = max(_sd(table[(best, algorithm)]), _sd(table[(second, algorithm)])) * 100
            verdict = (
                "one seed: no spread to judge it by"
                if len(table[(best, algorithm)]) < 2
                else "a clear lead (more than twice the larger seed std)"
                if gap > 2 * spread
                else "within two seed standard deviations: not a clear lead"
            )
            lines.append(
                f"- **{topology}, {algorithm}, ε = {c['target']:g} against a neighbour**: best "
                f"{NAMES[best]} {pm(table[(best, algorithm)])}, then {NAMES[second]} "
                f"{pm(table[(second, algorithm)])} (+{gap:.2f} pp, {verdict}); order "
                + " > ".join(
                    f"{NAMES[m]} {_mean(table[(m, algorithm)]) * 100:.2f} %" for m in ranked
                )
                + f"; non-private {pm(table[('none', algorithm)])}."
            )
        if len(algorithms) == 2:
            exact, low = algorithms
            parts = []
            for name in private:
                if name == "muffliato" and section["reuse_muffliato"]:
                    continue
                delta = (_mean(table[(name, low)]) - _mean(table[(name, exact)])) * 100
                spread = max(_sd(table[(name, low)]), _sd(table[(name, exact)])) * 100
                word = (
                    "one seed"
                    if len(table[(name, low)]) < 2
                    else "helps"
                    if delta > 2 * spread
                    else "hurts"
                    if delta < -2 * spread
                    else "no clear effect"
                )
                parts.append(f"{NAMES[name]} {delta:+.2f} pp ({word})")
            lines.append(
                f"- **{topology}**, low-rank compression (PowerGossip r1 vs exact gossip): "
                + "; ".join(parts)
                + " (a clear effect: more than twice the larger seed std)."
            )
    lines += accountant_lines(sections, c)
    lines += [
        "",
        "## Reproduce",
        "",
        "```",
        command,
        "```",
        "",
        "CSV: `privacy_mechanisms.csv` (one row per run, attack figures included).",
        "",
    ]
    return "\n".join(lines)


def _band(rows, key) -> str:
    lo = _mean(r[key][0] for r in rows)
    hi = _mean(r[key][1] for r in rows)
    return f"[{lo * 100:.1f}, {hi * 100:.1f}]" if "tpr" in key else f"[{lo:.3f}, {hi:.3f}]"


def attack_lines(sections, c) -> List[str]:
    """The neighbour's membership attack per topology, mechanism and algorithm."""
    lines = [
        "",
        "## Attacks: what the neighbour learns of membership",
        "",
        f"Privacy IV's protocol (`experiments/privacy_attacks/attacks.py`, reused): observer "
        f"{c['observer']} records every message it receives; the candidates are its neighbours "
        "1 and n - 1's members and held-out records (equal counts: the AUC is balanced). The "
        "attack model is what the observer can form from what it received at the last step: "
        "with exact gossip the received model itself (with ZIP-DL's zero-sum noise on it), "
        "with PowerGossip r1 the reconstruction from the last 4 messages "
        "(`privacy/reconstruction.py`); the victim's own model is the ceiling. LOSS, LiRA "
        f"offline and LiRA online ({sections[0]['setting']['references']} reference models per "
        "seed, each on a random half of the candidates plus the observer's shard, trained with "
        "a cosine-decayed lr; online also uses the references that did train on a candidate). Blind baselines: the class-prior score, and the same LOSS attack "
        "through a model trained on the observer's shard alone (it never saw a victim); null "
        "band: the central 95 % of AUC and TPR under random member labels (200 permutations). "
        "Mean over the seeds; TPR in %.",
        "",
        "| topology | mechanism | algorithm | LOSS AUC (received) | TPR @1 % | TPR @0.1 % | "
        "LiRA offline AUC (received) | LiRA TPR @1 % | LiRA online AUC (received) | LOSS AUC "
        "(victim's own) | blind model LOSS AUC | class prior AUC | null band AUC | null band "
        "TPR @1 % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    outside = []
    for section in sections:
        topology, rows = section["setting"]["topology"], section["rows"]
        for name in ("none", "local", "zipdl", "decor", "muffliato"):
            for algorithm in c["algorithms"]:
                group = [r for r in rows if r["mechanism"] == name and r["algorithm"] == algorithm]
                if not group:
                    continue

                def m(key, scale=1.0, digits=3, group=group):
                    return f"{_mean(r[key] for r in group) * scale:.{digits}f}"

                lines.append(
                    f"| {topology} | {NAMES[name]} | {algorithm} | {m('auc/received/LOSS')} | "
                    f"{m('tpr1/received/LOSS', 100, 2)} | {m('tpr0.1/received/LOSS', 100, 2)} | "
                    f"{m('auc/received/LiRA offline')} | "
                    f"{m('tpr1/received/LiRA offline', 100, 2)} | "
                    f"{m('auc/received/LiRA online')} | "
                    f"{m(chr(97) + 'uc/victim' + chr(39) + 's own/LOSS')} | "
                    f"{m('auc/blind model/LOSS')} | {m('auc/class prior')} | "
                    f"{_band(group, 'null/auc')} | {_band(group, 'null/tpr1')} |"
                )
                for attack in ("LOSS", "LiRA offline"):
                    for metric, band in (("auc", "null/auc"), ("tpr1", "null/tpr1")):
                        hi = _mean(r[band][1] for r in group)
                        value = _mean(r[f"{metric}/received/{attack}"] for r in group)
                        if value > hi:
                            outside.append(
                                (topology, NAMES[name], algorithm, attack, metric, value, hi)
                            )
    counts = sections[0]["rows"][0]
    lines += [
        "",
        f"Candidates per run: {counts['members']} members, {counts['nonmembers']} held-out "
        f"non-members (TPR at 0.1 % FPR: {counts['nonmembers'] * 0.001:g} non-members above the "
        "threshold).",
        "",
    ]
    lines.append(
        "Received-model attacks (LOSS, LiRA offline) whose AUC or TPR at 1 % FPR is above the "
        "null band's upper end (mean over the seeds, against the band's mean ends): "
        + (
            "; ".join(
                f"{t} {n} {a} {attack} "
                + (f"AUC {x:.3f} > {h:.3f}" if metric == "auc" else f"TPR {x:.2%} > {h:.2%}")
                for t, n, a, attack, metric, x, h in outside
            )
            if outside
            else "none: no row's neighbour attack is distinguishable from guessing here"
        )
        + "."
    )
    if all(s["reuse_muffliato"] for s in sections):
        lines.append(
            "Muffliato runs with DP-SGD's σ and mechanism here: its attack figures are local "
            "DP-SGD's rows."
        )
    return lines


def accountant_lines(sections, c) -> List[str]:
    lines = ["", "## What the accountants say, and what they do not", ""]
    constant = [s for s in sections if "network_neighbour" in s["noises"]["muffliato"]]
    network = "; ".join(
        f"{s['setting']['topology']}: Muffliato neighbour "
        f"{s['noises']['muffliato']['network_neighbour']:.3g}, most distant "
        f"{s['noises']['muffliato']['network_far']:.3g}; ZIP-DL neighbour "
        f"{s['noises']['zipdl']['network_neighbour']:.3g}, most distant "
        f"{s['noises']['zipdl']['network_far']:.3g}; DP-SGD's subsampled "
        f"{s['noises']['local']['local']:.3g}"
        + (
            f" (network views of the first {s['noises']['muffliato']['network_steps']} / "
            f"{s['noises']['zipdl']['network_steps']} of {s['noises']['local']['steps']} "
            "steps: lower bounds)"
            if min(s["noises"]["muffliato"]["network_steps"], s["noises"]["zipdl"]["network_steps"])
            < s["noises"]["local"]["steps"]
            else ""
        )
        for s in constant
    )
    schedule = sections[0]["setting"].get("schedule", "constant")
    if not constant:
        network = (
            f"not computed here: the view models a constant lr and this run's is {schedule} "
            "(the step lr_t scales each step's noise and its record's shift alike, but the view "
            "mixes steps of different lr_t, so the constant-lr bound does not carry over; not "
            "re-derived), so Muffliato's and ZIP-DL's ε is DP-SGD's local bound"
        )
    lines += [
        "- **Muffliato** adds the same noise as DP-SGD; only the accounting differs. Its network "
        "bound (the observer's exact view, `privacy/network_dp.py`, noise every step, any "
        "per-step record change) does not use subsampling, and a neighbour receives the "
        "victim's model at every step. The reported ε is the minimum of the two valid bounds; "
        "where the network bound is the larger, Muffliato needs DP-SGD's σ and its runs are "
        "DP-SGD's. The view is built over the first T steps (T doubled from "
        f"{c['network_steps']} until the "
        "bound settles the minimum, or the whole run): the view of a prefix is a function of "
        "the whole view, so its ε is a lower bound on the whole run's, and once it is above "
        "DP-SGD's ε the minimum is DP-SGD's exactly. Network bounds alone: " + network + ".",
        "- **ZIP-DL** adds, on every message, the sender's zero-sum noise for that edge (as large "
        "as one step's DP noise on the model at the base lr"
        + ("" if schedule == "constant" else f"; fixed, while the {schedule} lr shrinks DP's")
        + "), on top of DP-SGD. Its network bound is the same "
        "exact view with the zero-sum draws as extra Gaussian unknowns "
        "(`network_dp.zero_sum_matrix`); the reported ε is the minimum with DP-SGD's. The "
        "paper's own guarantee is not used.",
        "- **DECOR**: SecLDP (the paper's Algorithm 2, per pair): each step is a Gaussian "
        "mechanism with covariance σ_ind² I + σ_cor² L over the peers other than the "
        "adversary, whitened to noise multiplier 1/√[Σ⁻¹]_vv and subsampled at q; ε by RDP "
        "(Opacus) and, independently, by PLD (dp-accounting), both in the table. It assumes the "
        "adversary sees every peer's noisy update and holds its own pair keys only; against "
        "peers that pool all the victim's keys, only σ_ind protects (the 'knowing everything' "
        "column).",
    ]
    return lines


def _runs_text(n: int) -> str:
    return "one run" if n == 1 else f"{n} runs"


def _how_run(c) -> str:
    """The machine's load while the page's runs were made (one start/end pair per run), and
    whether they were niced where that was recorded (said nothing of where it was not)."""
    nice = c.get("nice") or [None]
    known = all(n is not None for n in nice)
    loads = c["load"]
    if len(loads) == 1:
        start, end = loads[0]
        return (
            "shared with other jobs ("
            + (("this run niced; " if nice[0] > 0 else "this run not niced; ") if known else "")
            + f"1-minute load average {start:.1f} at the start, {end:.1f} at the end)"
        )
    niced = (
        ""
        if not known
        else "all niced, "
        if all(n > 0 for n in nice)
        else "none niced, "
        if all(n == 0 for n in nice)
        else "some niced, "
    )
    return (
        f"shared with other jobs ({len(loads)} runs, {niced}1-minute load average "
        "at their start and end: " + "; ".join(f"{a:.1f} and {b:.1f}" for a, b in loads) + ")"
    )


def _sd(values) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0
