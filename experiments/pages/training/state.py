"""The training page drawn from its rows: the state the tables read (the runs by list, the γ
each sweep chose, the stages' running times), the iid rows' seed means, the paper's targets (each
MET or MISSED from the measured rows); training.md from them, the curves' CSV and the plots."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._figures import png, pyplot
from experiments.pages._markdown import csv_text, fill, template
from experiments.pages._suite_rows import with_curves
from experiments.suite.runs import BASE, LATENCY_S, QUICK_BASE, combine
from experiments.suite.tables import _pct, build_csv, build_table, exact_reference, header

from .convergence import COLLAPSE_FRACTION, FIXED_TARGET, SAY, cheapest_to_reach, common_target
from .convergence import equal_bytes_table, gap_table, gap_verdict
from .design import EXACT, POWERGOSSIP, RUN_LISTS, SLOW_ROWS, STAGES, WIDE_MODEL, chosen_gamma
from .design import noniid_grid, plan, settings


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


def state_of(rows: Rows) -> Dict[str, Any]:
    """The runs of `rows` by list (RUN_LISTS), with their γ text and curves, and the plan."""
    s = settings(rows.quick)
    swept = [label for label, template in s["rows"] if "{gamma}" in template]
    main_labels = {label for label, _ in s["rows"]}
    seconds: Dict[str, float] = {}  # the rows' own wall times summed by stage
    for record in rows.records:
        stage = stage_of(record.row)
        seconds[stage] = seconds.get(stage, 0.0) + record.seconds
    state: Dict[str, Any] = dict(plan=s, quick=rows.quick, command=rows.command)
    state.update(stage_seconds={name: seconds[name] for name in STAGES if name in seconds})
    state.update({k: [] for k in RUN_LISTS})
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
        "training.md": training_page(state, headline, made_by(rows), claims),
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
        gap = 100 * (exact["acc_avg"] - pg["acc_avg"])
        ratio = exact["mb_per_step"] / pg["mb_per_step"]
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


#: The epoch budget is "at the plateau" when the longer reference runs gain at most this many pp.
PLATEAU_PP = 0.5


def running_time(state: Dict[str, Any], missing: Sequence[str]) -> str:
    """Which stages ran, each one's seconds, and the number of training runs."""
    stages = "; ".join(f"{name} {sec:.0f} s" for name, sec in state["stage_seconds"].items())
    runs = sum(len(state[k]) for k in RUN_LISTS)
    text = SAY["running"].format(**state, stages=stages, runs=runs)
    if not missing:
        return text
    done, total = len(STAGES) - len(missing), len(STAGES)
    return SAY["partial"].format(done=done, total=total, missing=", ".join(missing)) + " " + text


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
    verdict = SAY["plateau" if worst <= PLATEAU_PP else "near plateau"]
    verdict = verdict.format(plateau=PLATEAU_PP, worst=worst, **plan)
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
    exact = _by_label(rows, EXACT)
    slow = [r["run_seconds"] for r in rows if r["label"] in labels and "error" not in r]
    if exact is None or not slow or not exact.get("run_seconds"):
        return ""
    return SAY["cost"].format(
        low=min(slow) / exact["run_seconds"], high=max(slow) / exact["run_seconds"]
    )


def training_page(
    state: Dict[str, Any], headline: Sequence[Dict], generated: str, claims: Sequence[str]
) -> str:
    """training.md from the rows so far (`state["missing"]`: the stages with runs still to make)."""
    plan, quick = state["plan"], state["quick"]
    slow = [label for label, _ in plan["rows"] if label in SLOW_ROWS]
    fewer = ""
    if slow and plan["choco_seeds"] < len(plan["seeds"]):
        cost = _cost_note(headline, slow)
        fewer = SAY["fewer seeds"].format(slow=" and ".join(slow), cost=cost, **plan)
    title = "Decentralized training: accuracy vs bytes, to convergence" + " (--quick)" * quick
    data = QUICK_BASE if quick else BASE
    recipe = SAY["recipe"].format(**data, full="" if quick else SAY["full recipe"].format(**data))
    return fill(
        template(__file__),
        **{**plan, "seeds": ", ".join(map(str, plan["seeds"]))},
        header=header(title, generated, recipe),
        running=running_time(state, state["missing"]),
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


#: training_curves.csv's columns: a run's, then one of its evaluations'.
CURVE_FIELDS = ("group", "topology", "partition", "model", "label", "algorithm", "seed", "epoch")
CURVE_FIELDS += ("mb_sent_per_peer", "acc_avg", "acc_local_mean", "acc_local_min")


def curves_csv(rows: Sequence[Dict[str, Any]]) -> str:
    """Every run's evaluation history, one line per evaluation."""
    lines = []
    for r in rows:
        for e in r.get("evals") or []:
            run = [r.get("model_kind", "main"), r["topology"], r["partition"], r.get("model", "")]
            run += [r["label"], r["algorithm"], r.get("seed", 0), e["epoch"], f"{e['mb']:.6g}"]
            lines.append([*run, e["acc_avg"], f"{e['acc_local_mean']:.6g}", e["acc_local_min"]])
    return csv_text(CURVE_FIELDS, lines)


def panels(
    state: Dict[str, Any], headline: Sequence[Dict[str, Any]]
) -> List[Tuple[str, List[Dict]]]:
    """(title, rows) of each panel: iid (seed means), Dirichlet, the wide model."""
    plan, wide = state["plan"], state["wide"]
    where = f"{plan['topology']} {plan['iid']}"
    seeds = ", ".join(str(s) for s in plan["seeds"])
    out = [(f"{where}, cnn1d (mean over seeds {seeds} where run)", list(headline))]
    noniid = list(state["noniid"])
    extra = [r for r in noniid_grid(state) if r["spec"] not in {x["spec"] for x in noniid}]
    if noniid:
        out.append((f"{plan['topology']} {plan['noniid']}, cnn1d, seed 0", noniid + extra))
    if wide:
        out.append((f"{where}, {wide[0].get('model', 'wide')}, seed 0", list(wide)))
    return out


def plot_training(state: Dict[str, Any], headline: Sequence[Dict[str, Any]]) -> Dict[str, bytes]:
    """{training_accuracy_vs_mb.png, training_accuracy_vs_epochs.png: their PNG bytes} ({} when
    no run has an evaluation history yet)."""
    plt = pyplot()

    groups = [
        (title, [r for r in rows if "error" not in r and r.get("evals")])
        for title, rows in panels(state, headline)
    ]
    groups = [(t, rows) for t, rows in groups if rows]
    if not groups:
        return {}
    pictures = {}
    palette = plt.get_cmap("tab10").colors
    labels = list(dict.fromkeys(r["label"].split(",")[0] for _, rows in groups for r in rows))
    colour = {label: palette[i % len(palette)] for i, label in enumerate(labels)}
    for x_key, file_name, x_label in (
        ("mb", "training_accuracy_vs_mb.png", "MB sent per peer (log scale)"),
        ("epoch", "training_accuracy_vs_epochs.png", "epoch"),
    ):
        fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 4.6), squeeze=False)
        for ax, (title, rows) in zip(axes.flat, groups):
            for r in rows:
                points = [
                    (e[x_key], 100 * e["acc_avg"])
                    for e in r["evals"]
                    if e["acc_avg"] is not None and (x_key != "mb" or e["mb"] > 0)
                ]
                legend = r["label"].split(",")[0]
                xs, ys = [p[0] for p in points], [p[1] for p in points]
                ax.plot(xs, ys, marker="o", ms=2, lw=1.2, label=legend, color=colour[legend])
            target = common_target(rows)
            if target is not None:
                label = f"common target {100 * target:.1f} %"
                ax.axhline(100 * target, color="gray", ls="--", lw=0.8, label=label)
            if x_key == "mb":
                ax.set_xscale("log")
            lows = [100 * e["acc_avg"] for r in rows for e in r["evals"][len(r["evals"]) // 3 :]]
            if lows:
                ax.set_ylim(max(0.0, min(lows) - 5), min(100.0, max(lows) + 2))
            ax.set_xlabel(x_label)
            ax.set_ylabel("averaged-model test accuracy (%)")
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        pictures[file_name] = png(fig, dpi=100)
    return pictures
