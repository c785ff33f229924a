"""The training page drawn from its rows: the state the tables read (the runs by list, the γ
each sweep chose, the stages' running times), the iid rows' seed means, and the paper's targets,
each MET or MISSED from the measured rows."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._suite_rows import with_curves
from experiments.suite.runs import combine
from experiments.suite.tables import _pct, build_csv

from .design import EXACT, POWERGOSSIP, RUN_LISTS, STAGES, WIDE_MODEL, chosen_gamma, plan, settings
from .markdown import SAY, training_page
from .plots import curves_csv, plot_training


def stage_of(row: Dict[str, Any]) -> str:
    """The stage a run belongs to, from its kind (and, for the iid rows, its seed)."""
    kind = row["model_kind"]
    if kind == "iid":
        return STAGES[4 if int(row.get("seed") or 0) else 1]
    return STAGES[{"sweep": 0, "noniid": 2, "wide": 3, "reference": 5}[kind]]


def gamma_text(run: Dict[str, Any], swept: set) -> str:
    """The table's γ cell: a sweep row's γ, "γ (swept)" for a swept algorithm's other rows,
    "topology" for an algorithm using the topology's γ, else "—"."""
    from gossip_powersgd.algorithms import gamma_kind

    gamma = run.get("gamma")
    if run["model_kind"] == "sweep":
        return f"{gamma:g}" if "error" in run else f"{gamma:.3g}"
    if run["label"] in swept and gamma is not None:
        return f"{gamma:g} (swept)"
    if "error" in run:
        return "—"
    return "topology" if gamma_kind(run["spec"]) == "topology" else "—"


def _stage_seconds(rows: Rows) -> Dict[str, float]:
    """The rows' own wall times summed by stage, for the stages that have rows."""
    seconds = {name: 0.0 for name in STAGES}
    for record in rows.records:
        seconds[stage_of(record.row)] += record.seconds
    done = {stage_of(record.row) for record in rows.records}
    return {name: seconds[name] for name in STAGES if name in done}


def state_of(rows: Rows) -> Dict[str, Any]:
    """The runs of `rows` by list (RUN_LISTS), with their γ text and curves, and the plan."""
    s = settings(rows.quick)
    swept = [label for label, template in s["rows"] if "{gamma}" in template]
    main_labels = {label for label, _ in s["rows"]}
    state: Dict[str, Any] = dict(plan=s, quick=rows.quick, command=rows.command)
    state.update(stage_seconds=_stage_seconds(rows), **{k: [] for k in RUN_LISTS})
    for run in with_curves(rows.data):
        run["gamma_text"] = gamma_text(run, set(swept))
        kind = {"sweep": "sweeps"}.get(run["model_kind"], run["model_kind"])
        if kind == "noniid" and run["label"] not in main_labels:
            kind = "noniid_extra"
        state[kind].append(run)
    chosen = {label: chosen_gamma(label, state["sweeps"]) for label in swept}
    state["chosen"] = {label: gamma for label, gamma in chosen.items() if gamma is not None}
    have = rows.by_key
    planned = [r for r in plan(rows.quick, have) if r.key not in have]
    unfinished = {stage_of({"model_kind": r.config["kind"], "seed": r.seed}) for r in planned}
    if swept and len(state["chosen"]) < len(swept):  # the swept rows are not even planned yet
        unfinished |= {STAGES[0], STAGES[1], STAGES[2]}
    state["missing"] = [name for name in STAGES if name in unfinished]
    return state


def render(rows: Rows) -> Outputs:
    """training.md, training.csv, training_curves.csv and the two plots, from the rows."""
    state = state_of(rows)
    every = [r for key in RUN_LISTS for r in state[key]]
    headline = combined_iid(state)
    claims = targets(headline, state["noniid"], state["wide"], state["reference"])
    outputs: Outputs = {
        "training.md": training_page(state, headline, made_by(rows), claims, state["missing"]),
        "training.csv": build_csv(every),
        "training_curves.csv": curves_csv(every),
    }
    outputs.update(plot_training(state, headline))
    return outputs


def combined_iid(state) -> List[Dict[str, Any]]:
    """One row per algorithm on iid: the mean (± std) over the seeds that ran."""
    out = []
    for label, _ in state["plan"]["rows"]:
        runs = [r for r in state["iid"] if r["label"] == label]
        good = [r for r in runs if "error" not in r]
        if good:
            gamma_text = good[0].get("gamma_text")
            out.append(dict(combine(good), label=label, model_kind="iid", gamma_text=gamma_text))
        elif runs:
            out.append(runs[0])
    return out


def _by_label(rows: Sequence[Dict[str, Any]], label: str) -> Optional[Dict[str, Any]]:
    found = (r for r in rows if r.get("label", "").split(",")[0] == label and "error" not in r)
    return next(found, None)


def targets(
    headline: Sequence[Dict[str, Any]],
    rows: Sequence[Dict[str, Any]],
    wide: Sequence[Dict[str, Any]],
    reference: Sequence[Dict[str, Any]] = (),
) -> List[str]:
    """The paper's claims, each stated as MET or MISSED, from the measured rows (`headline`: the
    combined iid rows; `rows`, `reference`: further CNN rows for the 90 % claim); their sentences
    in sections.md."""
    lines, met = [], {True: "MET", False: "MISSED"}
    exact, pg = _by_label(headline, EXACT), _by_label(headline, POWERGOSSIP)
    if exact and pg:
        gap, ratio = (
            100 * (exact["acc_avg"] - pg["acc_avg"]),
            exact["mb_per_step"] / pg["mb_per_step"],
        )
        saved, model = 100 * (1 - 1 / ratio), pg.get("model", "cnn1d")
        accs = dict(exact=_pct(exact["acc_avg"], exact.get("acc_avg_std")))
        accs.update(pg=_pct(pg["acc_avg"], pg.get("acc_avg_std")), seeds=pg.get("seeds", 1))
        lines.append(SAY["within"].format(**{**pg, **accs, "met": met[gap <= 1.0], "gap": gap}))
        why = SAY["why not fewer"] if saved < 99.0 and pg.get("model") == "cnn1d" else ""
        cells = dict(model=model, saved=saved, ratio=ratio, why=why)
        lines.append(SAY["fewer bytes"].format(**cells, met=met[saved >= 99.0]))
    w_exact, w_pg = _by_label(wide, EXACT), _by_label(wide, POWERGOSSIP)
    if w_exact and w_pg:
        ratio = w_exact["mb_per_step"] / w_pg["mb_per_step"]
        saved, gap = 100 * (1 - 1 / ratio), 100 * (w_exact["acc_avg"] - w_pg["acc_avg"])
        cells = dict(saved=saved, ratio=ratio, gap=gap, met=met[saved >= 99.0 and gap <= 1.0])
        cells.update(pg=_pct(w_pg["acc_avg"]), exact=_pct(w_exact["acc_avg"]))
        lines.append(SAY["wide claim"].format(**{**w_exact, **cells, "wide_model": WIDE_MODEL}))
    cnn = [r for r in [*headline, *rows, *reference] if "error" not in r]
    cnn = [r for r in cnn if r.get("acc_avg") is not None and r.get("model") == "cnn1d"]
    if cnn:
        best = max(cnn, key=lambda r: r["acc_avg"])
        seeds = f", mean of {best['seeds']} seeds" if best.get("seeds", 1) > 1 else ""
        cells = dict(met=met[best["acc_avg"] >= 0.90], acc=_pct(best["acc_avg"]), seeds=seeds)
        lines.append(SAY["cnn claim"].format(**{**best, **cells}))
    return lines
