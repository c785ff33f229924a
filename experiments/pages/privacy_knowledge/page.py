"""privacy_knowledge.md (page.md, sentences: words.md) and privacy_knowledge.json from the rows."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._markdown import fill, snippets, table_rows, template

WORDS = snippets(__file__, "words.md")
#: What a D-SGD estimate's error is to the blind guess's, by their ratio (from 1 up: no better).
CLOSE = ((0.8, "better than"), (1.0, "within 20 % of"))


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _cell(pair: Sequence[int]) -> str:
    return f"{pair[0]}/{pair[1]}"


def _mode(row: Dict[str, Any]) -> str:
    if row["updates"] == "once":
        return "averaging (once)"
    return "D-SGD (every step)" if row["tie"] == 1 else f"D-SGD, tie={row['tie']}"


def _colluders(r: Dict[str, Any], which: str) -> str:
    k, group = r[f"colluders_for_{which}"], r[f"colluder_set_for_{which}"]
    return f"{k} ({', '.join(map(str, group))})" if k else f"none ≤ {r['most']}"


def structure_table(rows: List[Dict[str, Any]]) -> List[str]:
    """One row per structural row: what peer 0 determines at each distance, and colluders."""
    cells = []
    for r in rows:
        ups, models = r["updates_by_distance"], r["models_by_distance"]
        far = [d for d in ups if d != "1"]
        target = f"peer {r['target']} (d={r['target_distance']}): " + _colluders(r, "target")
        cells.append(
            [r["topology"], _mode(r), str(r["steps"]), _cell(ups["1"]), _cell(models["1"])]
            + [", ".join(f"d{d}: {_cell(x[d])}" for d in far) or "–" for x in (ups, models)]
            + [target, _colluders(r, "all")]
        )
    return table_rows(cells)


def _fmt(x: Optional[float]) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3f}"


def _summaries(row: Dict[str, Any]) -> List[Dict[str, Any]]:
    """An attack row's `knowledge_attack.summarize`, labelled by its regime and algorithm."""
    from gossip_powersgd.privacy.knowledge_attack import summarize

    label = dict(regime=row["regime"], algorithm=row["label"])
    return [dict(label, **s) for s in summarize(row["attacks"], row["modes"])]


def attack_table(summaries: List[Dict[str, Any]]) -> List[str]:
    cells = [
        [s["regime"], s["algorithm"], ", ".join(map(str, s["colluders"]))]
        + [f"{s['part']} ({s['parameters']})", s["mode"], f"{s['peers']} ({s['count']})"]
        + [f"{s['determined']}/{s['count']}"]
        + [_fmt(s[k]) for k in ("error_median", "error_max", "blind_mean_median")]
        + [_fmt(s["blind_initial_median"])]
        for s in summaries
    ]
    return table_rows(cells)


def _alone(summaries: List[Dict[str, Any]], regime: str) -> List[Dict[str, Any]]:
    """The summaries of peer 0 attacking alone, on its non-neighbours, in `regime`."""
    mine = (s for s in summaries if s["regime"] == regime and s["colluders"] == [0])
    return [s for s in mine if s["peers"] == "non-neighbours"]


def verdict(structure: List[Dict[str, Any]], summaries: List[Dict[str, Any]]) -> List[str]:
    """The page's answers, from the numbers."""
    lines = []
    once = [r for r in structure if r["updates"] == "once"]
    for spec in dict.fromkeys(r["topology"] for r in once):
        mine = [r for r in once if r["topology"] == spec]
        full = next((r for r in mine if all(a == b for a, b in _far(r, all_=True))), None)
        v = dict(spec=spec, steps=mine[-1]["steps"], far=sum(b for _, b in _far(mine[-1])))
        v["full"] = f" (every peer from T = {full['steps']})" if full else ""
        lines.append(WORDS["averaging"].format(**v, got=sum(a for a, _ in _far(mine[-1]))))
    plain = [r for r in structure if r["updates"] == "every_step" and r["tie"] == 1]
    if plain:
        none = "no" if all(a == 0 for r in plain for a, _ in _far(r)) else "some"
        nobody = all(r["colluders_for_target"] is None for r in plain)
        colluders = WORDS["no colluders"] if nobody else "."
        lines.append(WORDS["dsgd"].format(none=none, colluders=colluders))
    for regime in ("averaging", "dsgd"):
        for algorithm in dict.fromkeys(s["algorithm"] for s in summaries):
            for s in _alone(summaries, regime):
                if s["algorithm"] == algorithm and (regime == "dsgd" or s["mode"] == "once"):
                    lines.append(WORDS["alone"].format(**_shown(s)))
    return lines


def _far(r: Dict[str, Any], all_: bool = False) -> List[Sequence[int]]:
    """(determined, of) per distance of a structural row, beyond the neighbours (`all_`: all)."""
    return [c for d, c in r["updates_by_distance"].items() if all_ or d != "1"]


def _shown(s: Dict[str, Any]) -> Dict[str, Any]:
    """A summary with its median and largest error and its blind guess's as the page writes them."""
    keys = dict(error="error_median", error_max="error_max", blind="blind_mean_median")
    return dict(s, **{k: _fmt(s[key]) for k, key in keys.items()})


def low_rank_answer(summaries: List[Dict[str, Any]]) -> List[str]:
    """Do low-rank messages reduce what non-neighbours lose? Per algorithm, from the rows."""
    lines = []
    mine = _alone(summaries, "averaging")
    for algorithm in dict.fromkeys(s["algorithm"] for s in mine):
        parts = {s["part"]: s for s in mine if s["algorithm"] == algorithm}
        exact, compressed, rest = parts.get("exact"), parts.get("compressed"), "."
        if compressed:
            better = compressed["error_median"] < compressed["blind_mean_median"]
            verdict = "better than blind." if better else "no better than the blind guess."
            rest = WORDS["compressed"].format(**_shown(compressed), verdict=verdict)
        lost = exact["parameters"] if exact and exact["error_max"] < 1e-4 else 0
        total = sum(s["parameters"] for s in parts.values())
        lines.append(WORDS["lost"].format(algorithm=algorithm, lost=lost, total=total, rest=rest))
    dsgd = _alone(summaries, "dsgd")
    for algorithm in dict.fromkeys(s["algorithm"] for s in dsgd):
        for part in ("exact", "compressed"):
            mine = [s for s in dsgd if s["algorithm"] == algorithm and s["part"] == part]
            if not mine:
                continue
            best = min(mine, key=lambda s: s["error_median"])
            ratio = best["error_median"] / best["blind_mean_median"]
            verdict = next((w for limit, w in CLOSE if ratio < limit), "no better than")
            lines.append(WORDS["dsgd best"].format(**_shown(best), verdict=verdict))
    return lines + [WORDS["worse than blind"]]


def render(rows: Rows) -> Outputs:
    """The page (its fixed text: page.md beside this file) and its JSON."""
    structure = [r for r in rows.data if r["kind"] == "structure"]
    attacks = [r for r in rows.data if r["kind"] == "attack"]
    summaries = [s for r in attacks for s in _summaries(r)]
    runs = [
        WORDS["run"].format(**r, acc=_pct(r["accuracy"]), local=_pct(r["local_accuracy"]))
        for r in attacks
    ]
    fields = dict(quick=" (--quick)" if rows.quick else "", made_by=made_by(rows), runs=runs)
    fields.update(structure=structure_table(structure), attacks=attack_table(summaries))
    fields.update(low_rank=low_rank_answer(summaries), verdict=verdict(structure, summaries))
    text = fill(template(__file__), **fields)
    data = {"structure": structure, "attack_summaries": summaries}
    return {
        "privacy_knowledge.md": text,
        "privacy_knowledge.json": json.dumps(data, indent=1, sort_keys=True) + "\n",
    }
