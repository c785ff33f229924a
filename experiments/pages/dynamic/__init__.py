"""`python -m experiments dynamic`: exact gossip and PowerGossip r1 on 16 peers over static graphs
(ring, torus) and graphs that change every step (one-peer exponential, matchings), push-sum on the
directed exponential schedule: consensus error vs bits, and training accuracy vs MB and time. The
page's text: page.md beside this file."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._figures import png, pyplot
from experiments.pages._markdown import block, csv_text, fill, snippets, table
from experiments.suite.runs import BANDWIDTHS, BASE, QUICK_BASE, projected_seconds
from experiments.suite.tables import _pct, build_csv, build_table, header
from gossip_powersgd.metrics import positive_points

#: (label, consensus spec, training spec) run on every graph; push-sum on the directed schedule only.
ALGORITHMS = (
    ("exact gossip", "exact", "exact"),
    ("PowerGossip r1", "powergossip:rank=1,iters=1,warm=true", "powergossip:rank=1,iters=1"),
)
PUSHSUM = ("push-sum", "pushsum", "pushsum")
POWERGOSSIP = "PowerGossip r1"
TARGETS = (1e-2, 1e-4)
TEXT = snippets(__file__, "page.md")


def setting(quick: bool) -> Dict[str, Any]:
    """The page's graphs and sizes (its JSON's "plan"); quick: 4 peers, an 8×8 matrix, 1 epoch."""
    n = 4 if quick else 16
    schedules = [f"one_peer_exponential:{n}", f"matchings:{n}"]
    return {
        "quick": quick,
        "topologies": [f"ring:{n}"] + ([] if quick else ["torus:4x4"]) + schedules,
        "schedules": schedules,
        "pushsum": [f"directed_exponential:{n}", *PUSHSUM],
        "problem": "matrix:8" if quick else "matrix",
        "budgets": [1e3, 1e4] if quick else [1e5, 1e6, 1e7],
        "max_bits": 1e4 if quick else 1e7,
        "max_steps": 200 if quick else 4000,
        "epochs": 1 if quick else 30,
    }


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """Every (graph, algorithm) in consensus, then the same in training."""
    p = setting(quick)
    cases = [(t, *a) for t in p["topologies"] for a in ALGORITHMS] + [tuple(p["pushsum"])]
    runs = []
    for topology, label, spec, _ in cases:
        config = {k: p[k] for k in ("problem", "max_steps", "max_bits", "budgets")}
        config.update(section="consensus", topology=topology, label=label, spec=spec)
        runs.append(Run(f"consensus/{topology}/{label}", config, cost=0.1))
    for topology, label, _, spec in cases:
        train = dict(QUICK_BASE if quick else BASE, topology=topology, partition="iid", seed=0)
        train.update(epochs=p["epochs"], eval_every=max(1, p["epochs"] // 10), algorithm=spec)
        train["comm_timeout"] = 600.0  # a loaded shared machine can stall a peer thread for minutes
        config = {"section": "training", "label": label, "train": train}
        runs.append(Run(f"training/{topology}/{label}", config))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """A consensus run (its curve; a failure is a row saying so) or a training run."""
    c = run.config
    if c["section"] == "training":
        from experiments.suite.runs import attempt_config

        out = attempt_config(c["label"], c["train"])
        schedule = c["train"]["topology"].startswith(("one_peer", "matchings"))
        if schedule and out.get("gamma_text") == "topology":
            out["gamma_text"] = "1 (schedule)"  # an unset γ on a schedule is 1, not a topology's
        return out
    import topologies

    from gossip_powersgd.launch import run_peers

    from experiments.pages.consensus.measure import consensus_curve

    out: Dict[str, Any] = {k: c[k] for k in ("topology", "label", "spec")}
    try:
        args = [c[k] for k in ("problem", "spec", "max_steps", "max_bits", "budgets")]
        graph = topologies.parse(c["topology"])
        values = run_peers(graph, consensus_curve, *args, min(TARGETS) / 2, backend="local")
    except Exception as exc:  # a failing run is a row saying so, not a lost page
        out["error_text"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
        return out
    if any(v["history"] != values[0]["history"] for v in values.values()):
        raise RuntimeError(f"{c['topology']} {c['spec']}: the peers recorded different histories")
    h = values[0]["history"]
    out.update(history=h, stop=values[0]["stop"], seconds=values[0]["seconds"], steps=h[-1]["step"])
    return dict(out, bits_run=h[-1]["bits_per_peer"], error0=h[0]["error"])


def render(rows: Rows) -> Outputs:
    """dynamic.md (its text: page.md beside this file), its two CSVs, dynamic.json, the plots."""
    from gossip_powersgd.metrics import bits_to_reach, error_at_bits

    p, n = setting(rows.quick), 4 if rows.quick else 16
    stored = [r for r in rows.records if r.config["section"] == "consensus"]
    consensus = [r.row for r in stored]
    training = [r.row for r in rows.records if r.config["section"] == "training"]
    # the older program's page-level figures, when every row was converted from its output
    origins = {json.dumps(r.origin, sort_keys=True) for r in rows.records}
    old = (rows.records[0].origin if len(origins) == 1 else None) or {}
    seconds = old.get("seconds", sum(r.seconds for r in rows.records))
    consensus_seconds = old.get("consensus_seconds", sum(r.seconds for r in stored))
    shown = []
    for r in consensus:
        if "history" in r:
            h, at = r["history"], {b: error_at_bits(r["history"], b) for b in p["budgets"]}
            at = {b: None if e is None else e / r["error0"] for b, e in at.items()}
            r = dict(r, at_budget=at, to_reach={t: bits_to_reach(h, t) for t in TARGETS})
        shown.append(r)
    # the accuracy every PowerGossip run reached: the lowest final accuracy among them
    finals = [r["acc_avg"] for r in training if r["label"] == POWERGOSSIP and "error" not in r]
    target = min(finals) if finals else None
    running = TEXT["running"].format(minutes=seconds / 60, consensus_minutes=consensus_seconds / 60)
    title = f"Gossip on graphs that change every step, {n} peers" + " (--quick)" * p["quick"]
    reach = [] if target is None else block(TEXT["reach"].format(target=_pct(target)) + "\n\n")
    consensus_md, consensus_csv = consensus_tables(shown, p["budgets"])
    text = fill(
        TEXT["page"],
        **p,
        **(QUICK_BASE if p["quick"] else BASE),
        header=header(title, made_by(rows), running),
        verdict=verdict(shown, training, p, target),
        stop=min(TARGETS) / 2,
        consensus=block(consensus_md),
        n=n,
        eval_every=max(1, p["epochs"] // 10),
        training=block(build_table(training)),
        reach=reach + block(reach_table(training, target) if reach else ""),
    )
    data = {"command": old.get("command", rows.command), "seconds": seconds, "plan": p}
    data.update(consensus=consensus, training=training)
    return {
        "dynamic.md": text + "\n",
        "dynamic_consensus.csv": consensus_csv,
        "dynamic_training.csv": build_csv(training),
        "dynamic.json": json.dumps(data, indent=1, default=str) + "\n",
        **plots(shown, training, p),
    }


def _num(value: Optional[float], missing: str = "—") -> str:
    return missing if value is None else f"{value:.3g}"


def consensus_tables(rows: Sequence[Dict[str, Any]], budgets: Sequence[float]) -> Tuple[str, str]:
    """The consensus table (markdown) and dynamic_consensus.csv (to 6 digits), a row per run."""
    head = ["graph", "algorithm", "steps run", "bits run", "stop"]
    head += [f"rel. error @ {b:.0e} bits" for b in budgets]
    head += [f"bits to rel. error {t:.0e}" for t in TARGETS]
    csv_head = ["topology", "algorithm", "spec", "steps", "bits_run", "stop", "initial_error"]
    csv_head += [f"rel_error_at_{b:g}_bits" for b in budgets] + [f"bits_to_{t:g}" for t in TARGETS]
    lines = table(head, [], None)
    csv_lines = []
    for r in rows:
        first = [r["topology"], r["label"], r["spec"]]
        if "error_text" in r:
            failed = f"| {r['topology']} | {r['label']} | FAILED: {r['error_text']} |"
            lines.append(failed + " |" * (len(head) - 3))
            csv_lines.append(first + [""] * (5 + len(budgets) + len(TARGETS)) + [r["error_text"]])
            continue
        at, to = [r["at_budget"][b] for b in budgets], [r["to_reach"][t] for t in TARGETS]
        cells = [r["topology"], r["label"], str(r["steps"]), f"{r['bits_run']:.3g}", r["stop"]]
        missing = f"not reached (> {r['bits_run']:.3g})"
        cells += [_num(x) for x in at] + [_num(x, missing) for x in to]
        lines.append("| " + " | ".join(cells) + " |")
        precise = ["" if x is None else f"{x:.6g}" for x in at + to]
        csv = first + [r["steps"], r["bits_run"], r["stop"], r["error0"], *precise]
        csv_lines.append(csv + [f"{r['seconds']:.1f}", ""])
    return "\n".join(lines) + "\n", csv_text(csv_head + ["seconds", "error"], csv_lines)


def reach(curve: Sequence[Tuple[float, float]], target: float) -> Optional[float]:
    """The x at which an accuracy curve first reaches `target` (linear between evaluations)."""
    previous = None
    for x, acc in curve:
        if acc >= target:
            if previous is None or previous[1] >= acc:
                return x
            t = (target - previous[1]) / (acc - previous[1])
            return previous[0] + t * (x - previous[0])
        previous = (x, acc)
    return None


def mb_curve(row: Dict[str, Any]) -> List[Tuple[float, float]]:
    """(MB per peer, averaged-model accuracy) at each evaluation that has one."""
    return [(x, a) for x, a in row["curve"] if a is not None]


def time_curve(row: Dict[str, Any], bandwidth: float) -> List[Tuple[float, float]]:
    """(projected seconds, averaged-model accuracy) at each evaluation: the run's projected time
    scaled by the evaluation's share of its bytes (a step's traffic is constant on these graphs)."""
    total, mb_total = projected_seconds(row, bandwidth), row["mb_per_peer"] or 1.0
    return [(total * mb / mb_total, acc) for mb, acc in mb_curve(row)]


def reach_table(rows: Sequence[Dict[str, Any]], target: float) -> str:
    """Markdown: MB and projected seconds per peer at which each run first reaches `target`."""
    head = ["graph", "algorithm", "final acc", f"MB to {_pct(target)}"]
    head += [f"projected s to {_pct(target)} @ {name}" for name, _ in BANDWIDTHS]
    cells = []
    for r in (r for r in rows if "error" not in r):
        curves = [mb_curve(r)] + [time_curve(r, bw) for _, bw in BANDWIDTHS]
        cells.append([r["topology"], r["label"], _pct(r["acc_avg"])])
        cells[-1] += [_num(reach(curve, target), "not reached") for curve in curves]
    return "\n".join(table(head, cells, None)) + "\n"


def _pg(rows: Sequence[Dict[str, Any]], topology: str) -> Dict[str, Any]:
    ok = (r for r in rows if r["topology"] == topology and r["label"] == POWERGOSSIP)
    return next((r for r in ok if "error" not in r and "error_text" not in r), {})


def _compare(name: str, values: Dict[str, Optional[float]], schedules, statics, unit: str) -> str:
    """One verdict line: each schedule's cost against each static graph's (lower is better)."""
    parts = []
    for s in schedules:
        for g in statics:
            a, b = values.get(s), values.get(g)
            if a is None and b is None:
                parts.append(f"{s} vs {g}: neither reached it")
            elif a is None or b is None:
                yes, missed = ("no", s) if a is None else ("yes", g)
                parts.append(f"{s} vs {g}: **{yes}** ({missed} did not reach it)")
            else:
                more = "fewer" if a < b else "more" if a > b else "equal"
                parts.append(f"{s} vs {g}: **{'yes' if a < b else 'no'}**, {b / a:.2f}× ({more})")
    graphs = list(schedules) + list(statics)
    costs = ", ".join(f"{t} {_num(values.get(t), 'not reached')}" for t in graphs)
    return f"- {name} ({unit}: {costs}): " + "; ".join(parts) + "."


def verdict(consensus, training, p: Dict[str, Any], target: Optional[float]) -> List[str]:
    """Fewer bytes on a one-peer schedule than on a ring or torus? (Its sentences: page.md.)"""
    graphs, schedules = p["topologies"], p["schedules"]
    args = (schedules, [t for t in graphs if t not in schedules])
    lines = []
    for t in TARGETS:
        values = {g: _pg(consensus, g).get("to_reach", {}).get(t) for g in graphs}
        lines.append(_compare(TEXT["consensus reach"].format(target=t), values, *args, "bits"))
    if target is None:
        return lines

    def mb_to(accuracy: float) -> Dict[str, Optional[float]]:
        pg = {g: _pg(training, g) for g in graphs}
        return {g: reach(mb_curve(pg[g]), accuracy) if pg[g] else None for g in graphs}

    name = TEXT["training reach"].format(target=_pct(target))
    lines.append(_compare(name, mb_to(target), *args, "MB"))
    finals = {g: _pg(training, g).get("acc_avg") for g in graphs}
    text = ", ".join(f"{g} {_pct(a)}" for g, a in finals.items())
    lines.append(TEXT["finals"].format(finals=text))
    static_finals = [finals[g] for g in args[1] if finals.get(g) is not None]
    higher = min(static_finals, default=None)
    if higher is not None and higher > target:
        # The common bar is the weakest run's final accuracy; the static graphs' bar shows whether
        # the schedules' byte saving survives a higher accuracy.
        name = TEXT["higher"].format(target=_pct(higher))
        lines.append(_compare(name, mb_to(higher), *args, "MB"))
    per_step = {g: _pg(training, g).get("mb_per_step") for g in graphs}
    if all(per_step.values()):
        text = ", ".join(f"{g} {v * 1e3:.3g} kB" for g, v in per_step.items())
        lines.append(TEXT["why"].format(per_step=text, epochs=p["epochs"]))
    return lines


def _style(topology: str, label: str, p: Dict[str, Any]) -> Dict[str, Any]:
    order = list(p["topologies"]) + [p["pushsum"][0]]
    style = "--" if label == "exact gossip" else "-" if label == POWERGOSSIP else ":"
    return dict(color=f"C{order.index(topology) % 10}", linestyle=style)


def plots(consensus, training, p: Dict[str, Any]) -> Dict[str, bytes]:
    """dynamic_error_vs_bits.png and dynamic_accuracy.png (vs MB and vs projected time)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in (r for r in consensus if "history" in r):
        pts, label = positive_points(r["history"]), f"{r['topology']} {r['label']}"
        x, y = [x["bits_per_peer"] for x in pts], [x["error"] / r["error0"] for x in pts]
        ax.plot(x, y, label=label, linewidth=1.4, **_style(r["topology"], r["label"], p))
    for t in TARGETS:
        ax.axhline(t, color="0.6", linestyle=":", linewidth=0.8)
    ax.set(xscale="log", yscale="log", xlabel="bits sent per peer")
    ax.set_ylabel("relative error ‖x_i − x̄‖² / initial")
    ax.set_title(f"consensus, {p['problem']} per peer", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    out = {"dynamic_error_vs_bits.png": png(fig)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in (r for r in training if "error" not in r):
        style, mb = _style(r["topology"], r["label"], p), [(x, a) for x, a in mb_curve(r) if x > 0]
        label = f"{r['topology']} {r['label']}"
        xs, ys = [x for x, _ in mb], [100 * a for _, a in mb]
        axes[0].plot(xs, ys, marker="o", ms=3, label=label, **style)
        tc = time_curve(r, BANDWIDTHS[0][1])
        axes[1].plot([x for x, _ in tc], [100 * a for _, a in tc], marker="o", ms=3, **style)
    axes[0].set(xscale="log", xlabel="MB sent per peer")
    axes[1].set_xlabel(f"projected wall time per peer (s) @ {BANDWIDTHS[0][0]}")
    for ax in axes:
        ax.set_ylabel("averaged-model test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    out["dynamic_accuracy.png"] = png(fig)
    return out


TITLE = (
    "graphs that change every step (one-peer exponential, matchings) vs ring and torus, 16 peers"
)
PAGE = register(Page(name="dynamic", title=TITLE, plan=plan, row=row, render=render))
