"""What both mechanisms pages show of their rows (`outputs`; headers: their templates; sentences:
words.md): calibration, accuracy and plateau, the neighbour's attack, answers, the CSV."""

from __future__ import annotations

import math
from statistics import fmean, stdev
from typing import Dict, List, Tuple

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._markdown import csv_text as md_csv
from experiments.pages._markdown import fill, mean_sd, pm, snippets, table_rows

NAMES = dict(none="non-private", local="local DP-SGD", muffliato="Muffliato", zipdl="ZIP-DL")
NAMES["decor"] = "DECOR"
PRIVATE = ("local", "muffliato", "zipdl", "decor")
WORDS = snippets(__file__, "words.md")
#: The attack table's figures after its labels (TPRs in %), then the chance band's.
ATTACK_CELLS = (
    "auc/received/LOSS|tpr1/received/LOSS|tpr0.1/received/LOSS|auc/received/LiRA offline|"
    "tpr1/received/LiRA offline|auc/received/LiRA online|auc/victim's own/LOSS|"
    "auc/blind model/LOSS|tpr0.1/blind model/LOSS|auc/class prior"
).split("|")
#: The received-model figures checked against the chance band: (figure, its name, its format).
OUTSIDE = (("auc", "AUC", ".3f"), ("tpr1", "TPR", ".2%"))


def _sd(values) -> float:
    return stdev(values) if len(values) > 1 else 0.0


def _pm(values: List[float]) -> str:
    """mean ± std in %; "n/a" where no run evaluated there (a --quick run's quarters)."""
    values = [v for v in values if not math.isnan(v)]
    return pm(*mean_sd(values), ".2f", 100, " %") if values else "n/a"


def groups(rows, algorithms, names=("none",) + PRIVATE, reused: bool = False):
    """(mechanism, algorithm, rows) per pair with rows; `reused`: Muffliato may show local's."""
    own = {r["mechanism"] for r in rows}
    for name in names:
        source = "local" if reused and name == "muffliato" and name not in own else name
        for algorithm in algorithms:
            group = [r for r in rows if r["mechanism"] == source and r["algorithm"] == algorithm]
            if group:
                yield name, algorithm, group


def outputs(name: str, text: str, rows: Rows, sections, c, load, nice, **fields) -> Outputs:
    """`name`.md (`text` filled with `fields`, `c` and `shown(sections)`) and `name`.csv."""
    runs = [r for s in sections for r in s["rows"]]
    fields.update(generated=made_by(rows), command=rows.command, how_run=how_run(load, nice))
    fields["per_step"] = fmean(r["run_seconds"] / r["steps"] for r in runs)
    text = fill(text, **fields, **c, **shown(sections, c))
    return {f"{name}.md": text, f"{name}.csv": csv_text(runs)}


def shown(sections, c) -> Dict[str, List[str]]:
    """The calibration, accuracy, plateau, attack and answer lines of `sections`."""
    tables: Dict[str, Dict[tuple, List[float]]] = {}
    results, plateau = results_lines(sections, c, tables)
    answers = [
        line
        for section in sections
        for line in answer_lines(section, tables[section["setting"]["topology"]], c)
    ]
    out = dict(calibration=calibration_lines(sections), results=results, plateau=plateau)
    return dict(out, attacks=attack_lines(sections, c), answers=answers)


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
    return table_rows(rows)


def results_lines(sections, c, tables) -> Tuple[List[str], List[str]]:
    """The accuracy table and the plateau check; each topology's final accuracies into `tables`."""
    lines, plateau = [], {}
    for section in sections:
        topology = section["setting"]["topology"]
        table, plateau[topology] = tables.setdefault(topology, {}), []
        for name, algorithm, group in groups(section["rows"], c["algorithms"], reused=True):
            reuse = name == "muffliato" and section["reuse_muffliato"]
            acc, late = [r["acc_avg"] for r in group], [r["acc_3q"] for r in group]
            change = fmean([(a - h) * 100 for a, h in zip(acc, late)])
            table[(name, algorithm)] = acc
            if name != "none" and not reuse:
                plateau[topology].append((name, algorithm, change, _sd(acc) * 100))
            label = NAMES[name] + (" (= local DP-SGD's runs)" if reuse else "")
            pms = [_pm([r[k] for r in group]) for k in ("acc_half", "acc_3q", "acc_avg")]
            cells = [topology, label, algorithm, str(len(group)), *pms, f"{change:+.2f}"]
            cells += [_pm([r[k] for r in group]) for k in ("acc_local_mean", "acc_local_min")]
            lines.append(cells + [f"{fmean(r['mb_per_peer'] for r in group):.3f}"])
    return table_rows(lines), plateau_lines(sections, plateau)


def plateau_lines(sections, plateau) -> List[str]:
    """Per topology, how much the private rows change over the last quarter, and the verdict."""
    setting = sections[0]["setting"]
    kind = "constant" if setting.get("schedule", "constant") == "constant" else "decaying"
    lines = [WORDS[kind].format(schedule=setting["schedule"]), ""]
    epochs = {s["setting"]["topology"]: s["setting"]["epochs"] for s in sections}
    for topology, entries in plateau.items():
        rising = [e for e in entries if e[2] > max(e[3], 1e-12)]
        biggest = max(entries, key=lambda e: e[2])
        listed = "; ".join(f"{NAMES[n]} {a} {d:+.2f} pp vs std {sd:.2f}" for n, a, d, sd in rising)
        count, e = f"{len(rising)} of {len(entries)} rows", epochs[topology]
        verdict = WORDS[f"{kind} {'rising' if rising else 'flat'}"]
        v = dict(topology=topology, start=3 * e // 4, epochs=e, low=min(x[2] for x in entries))
        v.update(high=biggest[2], name=NAMES[biggest[0]], algorithm=biggest[1])
        lines.append(
            WORDS["plateau"].format(**v, verdict=verdict.format(**v, count=count, listed=listed))
        )
    return lines


def _clear(delta: float, spread: float, seeds: int, words=("helps", "hurts", "no clear effect")):
    """`words[0]` beyond twice `spread`, `words[1]` below minus it, else the last; or one seed."""
    if seeds < 2:
        return "one seed"
    return words[0] if delta > 2 * spread else words[1] if delta < -2 * spread else words[2]


def answer_lines(section, table, c) -> List[str]:
    """The best mechanism per algorithm, and what low-rank compression does to each."""
    lines, topology, algorithms = [], section["setting"]["topology"], c["algorithms"]
    for algorithm in algorithms:
        ranked = sorted(PRIVATE, key=lambda m: -fmean(table[(m, algorithm)]))
        best, second = table[(ranked[0], algorithm)], table[(ranked[1], algorithm)]
        gap, spread = (fmean(best) - fmean(second)) * 100, max(_sd(best), _sd(second)) * 100
        verdict = _clear(gap, spread, len(best), ("lead", "no lead", "no lead"))
        order = " > ".join(f"{NAMES[m]} {fmean(table[(m, algorithm)]) * 100:.2f} %" for m in ranked)
        v = dict(topology=topology, algorithm=algorithm, target=c["target"], gap=gap, order=order)
        v.update(best=NAMES[ranked[0]], second=NAMES[ranked[1]], best_pm=_pm(best))
        v.update(second_pm=_pm(second), plain=_pm(table[("none", algorithm)]))
        lines.append(WORDS["answer"].format(**v, verdict=WORDS.get(verdict, verdict)))
    if len(algorithms) == 2:
        exact, low = algorithms
        parts = []
        for name in (n for n in PRIVATE if n != "muffliato" or not section["reuse_muffliato"]):
            mine, theirs = table[(name, low)], table[(name, exact)]
            delta, spread = (fmean(mine) - fmean(theirs)) * 100, max(_sd(mine), _sd(theirs)) * 100
            parts.append(f"{NAMES[name]} {delta:+.2f} pp ({_clear(delta, spread, len(mine))})")
        lines.append(WORDS["low rank"].format(topology=topology, parts="; ".join(parts)))
    return lines


def _band(rows, key) -> str:
    lo, hi = fmean(r[key][0] for r in rows), fmean(r[key][1] for r in rows)
    return f"[{lo * 100:.1f}, {hi * 100:.1f}]" if "tpr" in key else f"[{lo:.3f}, {hi:.3f}]"


def _cell(group, key: str) -> str:
    """The group's mean of figure `key`: a TPR in % to 2 decimals, else to 3."""
    tpr = key.startswith("tpr")
    return f"{fmean(r[key] for r in group) * (100 if tpr else 1):.{2 if tpr else 3}f}"


def attack_lines(sections, c) -> List[str]:
    """The neighbour's attack per topology, mechanism and algorithm, and what beats chance."""
    lines = []
    outside = []
    names = ("none", "local", "zipdl", "decor", "muffliato")
    for section in sections:
        topology = section["setting"]["topology"]
        for name, algorithm, group in groups(section["rows"], c["algorithms"], names):
            cells = [_cell(group, k) for k in ATTACK_CELLS]
            cells += [_band(group, f"null/{k}") for k in ("auc", "tpr1", "tpr0.1")]
            lines.append([topology, NAMES[name], algorithm] + cells)
            for attack in ("LOSS", "LiRA offline"):
                for metric, shown_as, f in OUTSIDE:
                    hi = fmean(r[f"null/{metric}"][1] for r in group)
                    value = fmean(r[f"{metric}/received/{attack}"] for r in group)
                    if value > hi:
                        seen = f"{shown_as} {value:{f}} > {hi:{f}}"
                        outside.append(f"{topology} {NAMES[name]} {algorithm} {attack} {seen}")
    counts = sections[0]["rows"][0]
    v = dict(members=counts["members"], nonmembers=counts["nonmembers"])
    v.update(above=counts["nonmembers"] * 0.001)
    v["outside"] = "; ".join(outside) or WORDS["none outside"]
    out = table_rows(lines) + WORDS["candidates"].format(**v).split("\n")
    return out + ([WORDS["muffliato"]] if all(s["reuse_muffliato"] for s in sections) else [])


def how_run(loads, nice) -> str:
    """The machine's load over the runs (start/end per run) and whether they were niced."""
    nice = nice or [None]
    known = all(n is not None for n in nice)
    if len(loads) == 1:
        niced = ("this run niced; " if nice[0] else "this run not niced; ") if known else ""
        return WORDS["one run"].format(niced=niced, start=loads[0][0], end=loads[0][1])
    niced = "all niced, " if all(nice) else "none niced, " if not any(nice) else "some niced, "
    pairs = "; ".join(f"{a:.1f} and {b:.1f}" for a, b in loads)
    return WORDS["runs"].format(count=len(loads), niced=niced if known else "", loads=pairs)


def csv_text(rows) -> str:
    """One CSV line per run (attack figures included), as the runs wrote it (\\r\\n lines)."""
    models, attacks = ("received", "victim's own", "blind model"), ("LOSS", "LiRA offline")
    keys = (
        "topology mechanism algorithm seed acc_half acc_3q acc_avg acc_local_mean acc_local_min "
        "mb_per_peer steps run_seconds members nonmembers"
    ).split()
    keys += [f"{x}/{m}/{a}" for m in models for a in attacks for x in ("auc", "tpr1", "tpr0.1")]
    keys += [f"{x}/class prior" for x in ("auc", "tpr1", "tpr0.1")]
    return md_csv(keys, ([r.get(k, "") for k in keys] for r in rows)).replace("\n", "\r\n")
