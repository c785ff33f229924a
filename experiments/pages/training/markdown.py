"""The training page's markdown (training.md), from the state `state.state_of` builds."""

from __future__ import annotations

from typing import Any, Dict, Sequence

from experiments.suite.runs import BASE, LATENCY_S, QUICK_BASE
from experiments.suite.tables import _pct, build_table, exact_reference, header

from .convergence import COLLAPSE_FRACTION, FIXED_TARGET, cheapest_to_reach, equal_bytes_table
from .design import RUN_LISTS, SLOW_ROWS, STAGES, noniid_grid
from .noniid import SAY, gap_table, gap_verdict
from experiments.pages._markdown import fill, template

#: The epoch budget is "at the plateau" when the longer reference runs gain at most this many pp.
PLATEAU_PP = 0.5


def _recipe(quick: bool) -> str:
    data = QUICK_BASE if quick else BASE
    return SAY["recipe"].format(**data, full="" if quick else SAY["full recipe"].format(**data))


def running_time(state: Dict[str, Any], missing: Sequence[str]) -> str:
    """Which stages ran, each one's seconds, and the number of training runs."""
    stages = "; ".join(f"{name} {sec:.0f} s" for name, sec in state["stage_seconds"].items())
    runs = sum(len(state[k]) for k in RUN_LISTS)
    text = SAY["running"].format(**state, stages=stages, runs=runs)
    if missing:
        done, total = len(STAGES) - len(missing), len(STAGES)
        text = (
            SAY["partial"].format(done=done, total=total, missing=", ".join(missing)) + " " + text
        )
    return text


def epoch_budget(state: Dict[str, Any]) -> str:
    """The epochs used against the longer reference runs of the same recipe (seed 0)."""
    plan = state["plan"]
    if not state["reference"]:
        return SAY["no reference"].format(**plan)
    parts, deltas = [], []
    seed0 = {
        r["label"]: r for r in state["iid"][::-1] if r.get("seed", 0) == 0 and "error" not in r
    }
    for ref in state["reference"]:
        short = seed0.get(ref["label"])
        if "error" in ref or short is None:
            continue
        deltas.append(100 * (ref["acc_avg"] - short["acc_avg"]))
        parts.append(
            f"{ref['label']} {_pct(short['acc_avg'])} after {short['epochs']} epochs vs "
            f"{_pct(ref['acc_avg'])} after {ref['epochs']} ({deltas[-1]:+.2f} pp)"
        )
    if not parts:
        return SAY["reference failed"].format(**plan)
    worst = max(deltas)
    verdict = (
        SAY["plateau"].format(plateau=PLATEAU_PP)
        if worst <= PLATEAU_PP
        else SAY["near plateau"].format(worst=worst, **plan)
    )
    return SAY["budget"].format(parts="; ".join(parts), verdict=verdict, **plan)


def _equal_bytes(rows: Sequence[Dict[str, Any]], what: str) -> str:
    table, target, budget = equal_bytes_table(rows)
    if target is None:
        return ""
    cells = dict(what=what, target=_pct(target), fixed=_pct(FIXED_TARGET), budget=budget)
    text = SAY["equal bytes"].format(**cells, collapse=100 * COLLAPSE_FRACTION, table=table)
    best = cheapest_to_reach(rows, target)
    if best is not None:
        fewest = SAY["fewest"].format(target=_pct(target), label=best["label"], **best["reach"])
        text += "\n" + fewest + "\n"
    return text + "\n"


def _cost_note(rows: Sequence[Dict[str, Any]], labels: Sequence[str]) -> str:
    """ " (each run took N× an exact-gossip run here)", from the rows' measured run seconds."""
    exact = next((r for r in rows if r["label"] == "exact gossip" and "error" not in r), None)
    slow = [r["run_seconds"] for r in rows if r["label"] in labels and "error" not in r]
    if exact is None or not slow or not exact.get("run_seconds"):
        return ""
    return SAY["cost"].format(
        low=min(slow) / exact["run_seconds"], high=max(slow) / exact["run_seconds"]
    )


def training_page(
    state: Dict[str, Any],
    headline: Sequence[Dict[str, Any]],
    generated: str,
    claims: Sequence[str],
    missing: Sequence[str],
) -> str:
    """training.md from the rows so far (`missing`: the stages with runs still to make)."""
    plan, quick = state["plan"], state["quick"]
    slow = [label for label, _ in plan["rows"] if label in SLOW_ROWS]
    fewer = ""
    if slow and plan["choco_seeds"] < len(plan["seeds"]):
        cost = _cost_note(headline, slow)
        fewer = SAY["fewer seeds"].format(slow=" and ".join(slow), cost=cost, **plan)
    title = "Decentralized training: accuracy vs bytes, to convergence" + " (--quick)" * quick
    return fill(
        template(__file__),
        **{**plan, "seeds": ", ".join(map(str, plan["seeds"]))},
        header=header(title, state["command"], 0.0, _recipe(quick), generated=generated),
        running=running_time(state, missing),
        budget=epoch_budget(state),
        claims="\n".join(claims) or "- (no rows yet)",
        fewer=fewer,
        headline=build_table(headline),
        equal=_equal_bytes(headline, f"{plan['topology']} {plan['iid']}"),
        sections=noniid_sections(state) + other_sections(state),
        latency_us=LATENCY_S * 1e6,
    )


def noniid_sections(state: Dict[str, Any]) -> str:
    """The Dirichlet table and the non-IID gap of PowerGossip's ranks and iterations."""
    plan = state["plan"]
    if not state["noniid"]:
        return ""
    grid = noniid_grid(state)
    exact = exact_reference(state["noniid"], plan["topology"], plan["noniid"], "noniid")
    text = SAY["noniid"].format(
        table=build_table(state["noniid"]),
        equal=_equal_bytes(state["noniid"], f"{plan['topology']} {plan['noniid']}"),
        gap=gap_table(grid, exact),
        verdict="\n".join(gap_verdict(grid, exact)),
        **plan,
    )
    return text + "\n\n"


def other_sections(state: Dict[str, Any]) -> str:
    """The γ sweep, the wide model and the reference runs (each where it has rows)."""
    plan, text = state["plan"], ""
    if state["sweeps"]:
        chosen = ", ".join(f"{k} {v:g}" for k, v in state["chosen"].items())
        table = build_table(state["sweeps"])
        text += SAY["sweep"].format(table=table, chosen=chosen, **plan) + "\n\n"
    if state["wide"]:
        wide = dict(model=state["wide"][0].get("model", "?"), table=build_table(state["wide"]))
        text += SAY["wide"].format(**wide, equal=_equal_bytes(state["wide"], "wide model"), **plan)
    if state["reference"]:
        text += SAY["reference"].format(table=build_table(state["reference"]), **plan) + "\n"
    return text
