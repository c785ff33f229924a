"""privacy_knowledge.md and privacy_knowledge.json from the rows (pure: the same rows, the same
bytes)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._markdown import block, fill, template, text_table


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _cell(pair: Sequence[int]) -> str:
    return f"{pair[0]}/{pair[1]}"


def _mode(row: Dict[str, Any]) -> str:
    if row["updates"] == "once":
        return "averaging (once)"
    return "D-SGD (every step)" if row["tie"] == 1 else f"D-SGD, tie={row['tie']}"


def _colluders(k: Optional[int], group: Sequence[int], most: int) -> str:
    return f"{k} ({', '.join(map(str, group))})" if k else f"none ≤ {most}"


def structure_table(rows: List[Dict[str, Any]]) -> str:
    """One line per structural row: what peer 0 determines at each distance, and colluders."""
    header = (
        "topology | unknowns (updates) | T | neighbours: updates | models | non-neighbours: "
        "updates (by distance d) | models (by distance) | colluders for the farthest peer "
        "(non-neighbours of it) | colluders for every peer"
    )
    cells = []
    for r in rows:
        ups, models = r["updates_by_distance"], r["models_by_distance"]
        far = [d for d in ups if d != "1"]
        target = f"peer {r['target']} (d={r['target_distance']}): "
        cells.append(
            [r["topology"], _mode(r), str(r["steps"]), _cell(ups["1"]), _cell(models["1"])]
            + [", ".join(f"d{d}: {_cell(x[d])}" for d in far) or "–" for x in (ups, models)]
            + [
                target
                + _colluders(r["colluders_for_target"], r["colluder_set_for_target"], r["most"])
            ]
            + [_colluders(r["colluders_for_all"], r["colluder_set_for_all"], r["most"])]
        )
    return text_table(header, cells, rule="llrrrllll")


def _fmt(x: Optional[float]) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3f}"


def _summaries(row: Dict[str, Any]) -> List[Dict[str, Any]]:
    """An attack row's `knowledge_attack.summarize`, labelled by its regime and algorithm."""
    from gossip_powersgd.privacy.knowledge_attack import summarize

    label = dict(regime=row["regime"], algorithm=row["label"])
    return [dict(label, **s) for s in summarize(row["attacks"], row["modes"])]


def attack_table(summaries: List[Dict[str, Any]]) -> str:
    header = (
        "regime | algorithm | colluders | part (parameters) | attack | peers | determined | "
        "error median | error max | blind: colluders' mean | blind: x0"
    )
    cells = [
        [s["regime"], s["algorithm"], ", ".join(map(str, s["colluders"]))]
        + [f"{s['part']} ({s['parameters']})", s["mode"], f"{s['peers']} ({s['count']})"]
        + [f"{s['determined']}/{s['count']}"]
        + [_fmt(s[k]) for k in ("error_median", "error_max", "blind_mean_median")]
        + [_fmt(s["blind_initial_median"])]
        for s in summaries
    ]
    return text_table(header, cells, rule="llllllrrrrr")


def _alone(summaries: List[Dict[str, Any]], regime: str) -> List[Dict[str, Any]]:
    """The summaries of peer 0 attacking alone, on its non-neighbours, in `regime`."""
    return [
        s
        for s in summaries
        if s["regime"] == regime and s["colluders"] == [0] and s["peers"] == "non-neighbours"
    ]


def verdict(structure: List[Dict[str, Any]], summaries: List[Dict[str, Any]]) -> List[str]:
    """The page's answers, from the numbers."""
    lines = []
    once = [r for r in structure if r["updates"] == "once"]
    for spec in dict.fromkeys(r["topology"] for r in once):
        mine = [r for r in once if r["topology"] == spec]
        full = next(
            (r for r in mine if all(c[0] == c[1] for c in r["updates_by_distance"].values())),
            None,
        )
        far = sum(c[1] for d, c in mine[-1]["updates_by_distance"].items() if d != "1")
        got = sum(c[0] for d, c in mine[-1]["updates_by_distance"].items() if d != "1")
        lines.append(
            f"- Averaging on {spec}: peer 0 alone determines {got} of its {far} non-neighbours' "
            f"private values after T = {mine[-1]['steps']} steps"
            + (f" (every peer from T = {full['steps']})" if full else "")
            + "."
        )
    plain = [r for r in structure if r["updates"] == "every_step" and r["tie"] == 1]
    if plain:
        none = all(
            c[0] == 0 for r in plain for d, c in r["updates_by_distance"].items() if d != "1"
        )
        lines.append(
            "- Decentralized SGD with a fresh update per step: "
            + ("no" if none else "some")
            + " non-neighbour update is determined by peer 0 on any graph of the grid"
            + (
                ", and no colluder set of the sizes tried determines one of the farthest peer's."
                if all(r["colluders_for_target"] is None for r in plain)
                else "."
            )
        )
    for regime in ("averaging", "dsgd"):
        for algorithm in dict.fromkeys(s["algorithm"] for s in summaries):
            mode = "once" if regime == "averaging" else None
            rows = [
                s
                for s in _alone(summaries, regime)
                if s["algorithm"] == algorithm and (mode is None or s["mode"] == mode)
            ]
            for s in rows:
                lines.append(
                    f"- {regime}, {algorithm}, {s['part']} parameters ({s['parameters']}), "
                    f"attack {s['mode']}: peer 0 alone reconstructs its {s['count']} "
                    f"non-neighbours' to a median relative error {_fmt(s['error_median'])} "
                    f"(max {_fmt(s['error_max'])}; {s['determined']} determined) against "
                    f"{_fmt(s['blind_mean_median'])} for the blind guess (its own contribution)."
                )
    return lines


def low_rank_answer(summaries: List[Dict[str, Any]]) -> List[str]:
    """Do low-rank messages reduce what non-neighbours lose? Per algorithm, under averaging with
    peer 0 alone: the parameters reconstructed to float level and those no better than blind."""
    lines = []
    mine = _alone(summaries, "averaging")
    for algorithm in dict.fromkeys(s["algorithm"] for s in mine):
        parts = {s["part"]: s for s in mine if s["algorithm"] == algorithm}
        total = sum(s["parameters"] for s in parts.values())
        exact = parts.get("exact")
        lost = exact["parameters"] if exact and exact["error_max"] < 1e-4 else 0
        text = (
            f"- **{algorithm}**, averaging: peer 0 alone reconstructs {lost} of the {total} "
            f"parameters of each non-neighbour's private model to float32 level"
        )
        compressed = parts.get("compressed")
        if compressed:
            better = compressed["error_median"] < compressed["blind_mean_median"]
            text += (
                f"; on the other {compressed['parameters']} (the compressed matrix) its estimate "
                f"has median error {_fmt(compressed['error_median'])} against "
                f"{_fmt(compressed['blind_mean_median'])} blind: "
                + ("better than blind." if better else "no better than the blind guess.")
            )
        else:
            text += "."
        lines.append(text)
    dsgd = _alone(summaries, "dsgd")
    for algorithm in dict.fromkeys(s["algorithm"] for s in dsgd):
        for part in ("exact", "compressed"):
            mine = [s for s in dsgd if s["algorithm"] == algorithm and s["part"] == part]
            if not mine:
                continue
            best = min(mine, key=lambda s: s["error_median"])
            ratio = best["error_median"] / best["blind_mean_median"]
            verdict = (
                "better than"
                if ratio < 0.8
                else "within 20 % of"
                if ratio < 1
                else "no better than"
            )
            lines.append(
                f"- **{algorithm}**, D-SGD, {part} parameters ({best['parameters']}): peer 0's "
                f"best linear estimate of a non-neighbour's last model ({best['mode']}) has "
                f"median error {_fmt(best['error_median'])} against "
                f"{_fmt(best['blind_mean_median'])} blind: {verdict} the blind guess."
            )
    lines.append(
        "\nAn error above 1 is worse than guessing the public initial model: the least-squares "
        "solution of an undetermined or inconsistent system (a tie assumption real SGD breaks, "
        "or plugged-in estimates of compressed matrices) can be far off, and an attacker who "
        "cannot check it against the truth has no reason to prefer it to the blind guess."
    )
    return lines


def render(rows: Rows) -> Outputs:
    """The page (its fixed text: page.md beside this file) and its JSON."""
    structure = [r for r in rows.data if r["kind"] == "structure"]
    attacks = [r for r in rows.data if r["kind"] == "attack"]
    summaries = [s for r in attacks for s in _summaries(r)]
    title = "Knowledge-matrix attack: who curious peers reconstruct, exact gossip vs PowerGossip"
    text = fill(
        template(__file__),
        title=title + (" (--quick)" if rows.quick else ""),
        made_by=made_by(rows),
        structure=block(structure_table(structure)),
        runs=[
            f"- {r['regime']}, {r['label']} on {r['topology']}: {r['steps']} gossip steps, "
            f"test accuracy {_pct(r['accuracy'])} (averaged model), "
            f"{_pct(r['local_accuracy'])} (peers' own models, mean)."
            for r in attacks
        ],
        attacks=block(attack_table(summaries)),
        low_rank=low_rank_answer(summaries),
        verdict=verdict(structure, summaries),
    )
    data = {"structure": structure, "attack_summaries": summaries}
    return {
        "privacy_knowledge.md": text,
        "privacy_knowledge.json": json.dumps(data, indent=1, sort_keys=True) + "\n",
    }
