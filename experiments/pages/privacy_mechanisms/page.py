"""privacy_mechanisms.md and its CSV from the rows: the calibration of each topology, every run's
accuracy (plateau check) and the neighbour's attack, the answers in numbers and what the
accountants say; every number comes from the rows."""

from __future__ import annotations

import csv
import io
import math
import statistics
from typing import Any, Dict, List, Tuple

from experiments.pages._markdown import fill, mean_sd, pm, template
from experiments.pages._markdown import table as md_table

NAMES = dict(none="non-private", local="local DP-SGD", muffliato="Muffliato", zipdl="ZIP-DL")
NAMES["decor"] = "DECOR"
PRIVATE = ("local", "muffliato", "zipdl", "decor")


def _mean(values) -> float:
    return statistics.fmean(values)


def _sd(values) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _pm(values: List[float]) -> str:
    """mean ± std in %; "n/a" where no run evaluated there (a --quick run's quarters)."""
    values = [v for v in values if not math.isnan(v)]
    return pm(*mean_sd(values), ".2f", 100, " %") if values else "n/a"


def _group(rows, mechanism, algorithm) -> List[Dict[str, Any]]:
    """The rows of (mechanism, algorithm); Muffliato's are local DP-SGD's where it reused them."""
    if mechanism == "muffliato" and not any(r["mechanism"] == "muffliato" for r in rows):
        mechanism = "local"
    return [r for r in rows if r["mechanism"] == mechanism and r["algorithm"] == algorithm]


def shown(sections, c) -> Dict[str, List[str]]:
    """What both mechanisms pages show of their rows: the calibration, the accuracy table and its
    plateau check, the attacks and the answers."""
    tables: Dict[str, Dict[tuple, List[float]]] = {}
    results, plateau = results_lines(sections, c, tables)
    answers = [
        line
        for section in sections
        for line in answer_lines(section, tables[section["setting"]["topology"]], c)
    ]
    out = dict(calibration=calibration_lines(sections), results=results, plateau=plateau)
    return dict(out, attacks=attack_lines(sections, c), answers=answers)


def render_page(sections, generated, command, c) -> str:
    """The page (its fixed text: page.md beside this file): `sections` (per topology: setting,
    noises, rows, reuse_muffliato), `generated` (who made the rows), the command that makes the
    page, and `c` (the plan's constants and how the runs were made: load, nice, time per step)."""
    setting = sections[0]["setting"]
    noise = next(iter(sections[0]["noises"].values()))
    plain = sorted({r["seed"] for r in sections[0]["rows"] if r["mechanism"] == "none"})
    seeds, runs = setting["seeds"], len(c["load"])
    return fill(
        template(__file__),
        **{k: c[k] for k in ("clip", "delta", "target", "observer", "per_step", "network_steps")},
        generated=generated,
        command=command,
        how_run=_how_run(c),
        topologies=", ".join(s["setting"]["topology"] for s in sections),
        classes=setting["dataset"].split("classes=")[1].split(",")[0],
        **{k: setting[k] for k in ("model", "shard", "batch_size", "epochs", "references")},
        records=2 * setting["shard"],
        lr_text=_lr_text(setting),
        **{k: noise[k] for k in ("q", "steps")},
        seeds=", ".join(map(str, seeds)),
        plural="s" if len(plain) > 1 else "",
        plain=", ".join(map(str, plain)),
        topology_count=len(sections),
        seed_count=len(seeds),
        runs="one run" if runs == 1 else f"{runs} runs",
        **shown(sections, c),
        **accountant_fields(sections),
    )


def _lr_text(setting) -> str:
    schedule, lr = setting.get("schedule", "constant"), setting["lr"]
    if schedule == "constant":
        return (
            f"constant lr {lr}, no weight decay: the setting Muffliato's network accountant models"
        )
    return (
        f"lr {lr} with a {schedule} decay to 0 over the run, no weight decay; Muffliato's and "
        "ZIP-DL's network accountants model a constant lr, so here they report DP-SGD's local "
        "bound, which holds under any schedule"
    )


CALIBRATION = (
    "topology | mechanism | DP-SGD σ (DECOR: σ_ind) | extra noise | ε vs neighbour (RDP) | "
    "ε vs neighbour (PLD, dp-accounting) | ε vs most distant peer | ε vs a peer knowing "
    "everything it can | accountant"
)


def calibration_lines(sections) -> List[str]:
    """Each topology's noise per mechanism and the ε it gives."""
    rows = []
    for section in sections:
        for name in PRIVATE:
            n = section["noises"][name]
            rows.append(
                [section["setting"]["topology"], NAMES[name], f"{n['sigma']:.4g}", n["extra"]]
                + [f"{n['neighbour']:.3g}", f"{n['neighbour_pld']:.3g}"]
                + [f"{n['far']:.3g} (peer {n['far_peer']})", f"{n['local']:.3g}", n["note"]]
            )
    return md_table(CALIBRATION, rows, end=None)


def results_lines(sections, c, tables) -> Tuple[List[str], List[str]]:
    """The accuracy table and the plateau check; each topology's final accuracies into `tables`."""
    lines = [
        "| topology | mechanism | algorithm | seeds | acc at 1/2 | acc at 3/4 | acc at end | "
        "last-quarter change (pp) | local acc mean | local acc min | MB sent / peer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    plateau: Dict[str, List[tuple]] = {}
    for section in sections:
        topology, rows = section["setting"]["topology"], section["rows"]
        table, plateau[topology] = tables.setdefault(topology, {}), []
        for name in ("none",) + PRIVATE:
            reuse = name == "muffliato" and section["reuse_muffliato"]
            for algorithm in c["algorithms"]:
                group = _group(rows, name, algorithm)
                if not group:
                    continue
                acc, late = [r["acc_avg"] for r in group], [r["acc_3q"] for r in group]
                change = [(a - h) * 100 for a, h in zip(acc, late)]
                table[(name, algorithm)] = acc
                if name != "none" and not reuse:
                    plateau[topology].append((name, algorithm, _mean(change), _sd(acc) * 100))
                label = NAMES[name] + (" (= local DP-SGD's runs)" if reuse else "")
                lines.append(
                    f"| {topology} | {label} | {algorithm} | {len(group)} | "
                    f"{_pm([r['acc_half'] for r in group])} | {_pm(late)} | {_pm(acc)} | "
                    f"{_mean(change):+.2f} | {_pm([r['acc_local_mean'] for r in group])} | "
                    f"{_pm([r['acc_local_min'] for r in group])} | "
                    f"{_mean(r['mb_per_peer'] for r in group):.3f} |"
                )
    return lines, plateau_lines(sections, plateau)


def plateau_lines(sections, plateau) -> List[str]:
    setting = sections[0]["setting"]
    decaying = setting.get("schedule", "constant") != "constant"
    budget = (
        "[privacy_mechanisms_budget.md](privacy_mechanisms_budget.md) "
        "(`python -m experiments privacy_mechanisms_budget`)"
    )
    lines = [
        f"Under the {setting['schedule']} schedule the learning rate falls to 0 over the last "
        "quarter, and the averaged model's accuracy can rise there however long the run: the "
        "change within a run is no plateau test, so none is drawn from it here. The test is the "
        f"same plan at other budgets, each with its noise solved again for the target: {budget}. "
        "The change within this run, for the record:"
        if decaying
        else "At a constant lr a run that still rises over its last quarter by more than its "
        "seeds' spread has not reached its plateau; one that does not is on a plateau at this "
        f"measure. The same plan at other budgets: {budget}.",
        "",
    ]
    epochs = {s["setting"]["topology"]: s["setting"]["epochs"] for s in sections}
    for topology, entries in plateau.items():
        rising = [e for e in entries if e[2] > max(e[3], 1e-12)]
        biggest = max(entries, key=lambda e: e[2])
        listed = "; ".join(f"{NAMES[n]} {a} {d:+.2f} pp vs std {sd:.2f}" for n, a, d, sd in rising)
        count = f"{len(rising)} of {len(entries)} rows"
        if decaying:
            verdict = (
                f"{count} rise by more than their seeds' spread ({listed})."
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
                f"{count} still rise by more than their seeds' spread ({listed}): after "
                f"{epochs[topology]} epochs those rows are **not** shown at a plateau (a longer "
                "run: more epochs)."
            )
        lines.append(
            f"- **{topology}**: change over the last quarter (epoch {3 * epochs[topology] // 4} "
            f"to {epochs[topology]}) of the private rows: {min(e[2] for e in entries):+.2f} to "
            f"{biggest[2]:+.2f} pp (largest: {NAMES[biggest[0]]}, {biggest[1]}); " + verdict
        )
    return lines


def answer_lines(section, table, c) -> List[str]:
    """The best mechanism per algorithm, and what low-rank compression does to each."""
    lines, topology, algorithms = [], section["setting"]["topology"], c["algorithms"]
    for algorithm in algorithms:
        ranked = sorted(PRIVATE, key=lambda m: -_mean(table[(m, algorithm)]))
        best, second = table[(ranked[0], algorithm)], table[(ranked[1], algorithm)]
        gap, spread = (_mean(best) - _mean(second)) * 100, max(_sd(best), _sd(second)) * 100
        verdict = (
            "one seed: no spread to judge it by"
            if len(best) < 2
            else "a clear lead (more than twice the larger seed std)"
            if gap > 2 * spread
            else "within two seed standard deviations: not a clear lead"
        )
        order = " > ".join(f"{NAMES[m]} {_mean(table[(m, algorithm)]) * 100:.2f} %" for m in ranked)
        lines.append(
            f"- **{topology}, {algorithm}, ε = {c['target']:g} against a neighbour**: best "
            f"{NAMES[ranked[0]]} {_pm(best)}, then {NAMES[ranked[1]]} {_pm(second)} "
            f"(+{gap:.2f} pp, {verdict}); order {order}; non-private "
            f"{_pm(table[('none', algorithm)])}."
        )
    if len(algorithms) == 2:
        exact, low = algorithms
        parts = []
        for name in PRIVATE:
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
    return lines


def _band(rows, key) -> str:
    lo, hi = _mean(r[key][0] for r in rows), _mean(r[key][1] for r in rows)
    return f"[{lo * 100:.1f}, {hi * 100:.1f}]" if "tpr" in key else f"[{lo:.3f}, {hi:.3f}]"


def attack_lines(sections, c) -> List[str]:
    """The neighbour's membership attack per topology, mechanism and algorithm."""
    lines = [
        "| topology | mechanism | algorithm | LOSS AUC (received) | TPR @1 % | TPR @0.1 % | "
        "LiRA offline AUC (received) | LiRA TPR @1 % | LiRA online AUC (received) | LOSS AUC "
        "(victim's own) | blind model LOSS AUC | blind model LOSS TPR @0.1 % | class prior AUC | "
        "chance band AUC | chance band TPR @1 % | chance band TPR @0.1 % |",
        "|---" * 16 + "|",
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

                cells = [m("auc/received/LOSS"), m("tpr1/received/LOSS", 100, 2)]
                cells += [m("tpr0.1/received/LOSS", 100, 2), m("auc/received/LiRA offline")]
                cells += [m("tpr1/received/LiRA offline", 100, 2), m("auc/received/LiRA online")]
                cells += [m("auc/victim's own/LOSS"), m("auc/blind model/LOSS")]
                cells += [m("tpr0.1/blind model/LOSS", 100, 2), m("auc/class prior")]
                cells += [_band(group, "null/auc"), _band(group, "null/tpr1")]
                cells.append(_band(group, "null/tpr0.1"))
                lines.append(
                    f"| {topology} | {NAMES[name]} | {algorithm} | " + " | ".join(cells) + " |"
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
    above = "; ".join(
        f"{t} {n} {a} {attack} "
        + (f"AUC {x:.3f} > {h:.3f}" if metric == "auc" else f"TPR {x:.2%} > {h:.2%}")
        for t, n, a, attack, metric, x, h in outside
    )
    lines += [
        "",
        f"Candidates per run: {counts['members']} members, {counts['nonmembers']} held-out "
        f"non-members (TPR at 0.1 % FPR: {counts['nonmembers'] * 0.001:g} non-members above the "
        "threshold).",
        "",
        "Received-model attacks (LOSS, LiRA offline) whose AUC or TPR at 1 % FPR is above the "
        "chance band's upper end (mean over the seeds, against the band's mean ends): "
        + (above or "none: no row's neighbour attack is distinguishable from guessing here")
        + ".",
    ]
    if all(s["reuse_muffliato"] for s in sections):
        lines.append(
            "Muffliato runs with DP-SGD's σ and mechanism here: its attack figures are local "
            "DP-SGD's rows."
        )
    return lines


def accountant_fields(sections) -> Dict[str, str]:
    """What the accountants' paragraph says of this run's schedule and network bounds (never
    computed: `muffliato.network_applies`)."""
    schedule = sections[0]["setting"].get("schedule", "constant")
    network = (
        f"not computed here: the view models a constant lr and this run's is {schedule} "
        "(the step lr_t scales each step's noise and its record's shift alike, but the view "
        "mixes steps of different lr_t, so the constant-lr bound does not carry over; not "
        "re-derived), so Muffliato's and ZIP-DL's ε is DP-SGD's local bound"
    )
    shrinks = "" if schedule == "constant" else f"; fixed, while the {schedule} lr shrinks DP's"
    return dict(network=network, shrinks=shrinks)


def _how_run(c) -> str:
    """The machine's load while the page's runs were made (one start/end pair per run), and
    whether they were niced where that was recorded (said nothing of where it was not)."""
    nice, loads = c.get("nice") or [None], c["load"]
    known = all(n is not None for n in nice)
    if len(loads) == 1:
        (start, end), niced = loads[0], "this run niced; " if nice[0] else "this run not niced; "
        return (
            f"shared with other jobs ({niced if known else ''}1-minute load average {start:.1f} "
            f"at the start, {end:.1f} at the end)"
        )
    niced = "all niced, " if all(nice) else "none niced, " if not any(nice) else "some niced, "
    return (
        f"shared with other jobs ({len(loads)} runs, {niced if known else ''}1-minute load "
        "average at their start and end: "
        + "; ".join(f"{a:.1f} and {b:.1f}" for a, b in loads)
        + ")"
    )


def csv_text(rows) -> str:
    """One CSV line per run (attack figures included), as the runs wrote it (\\r\\n lines)."""
    models, attacks = ("received", "victim's own", "blind model"), ("LOSS", "LiRA offline")
    keys = (
        "topology mechanism algorithm seed acc_half acc_3q acc_avg acc_local_mean acc_local_min "
        "mb_per_peer steps run_seconds members nonmembers"
    ).split()
    keys += [f"{x}/{m}/{a}" for m in models for a in attacks for x in ("auc", "tpr1", "tpr0.1")]
    keys += [f"{x}/class prior" for x in ("auc", "tpr1", "tpr0.1")]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
