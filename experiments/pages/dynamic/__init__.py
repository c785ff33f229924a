"""`python -m experiments dynamic`: exact gossip and PowerGossip r1 on 16 peers over static graphs
(ring, torus) and graphs that change every step (one-peer exponential, matchings), push-sum on the
directed exponential schedule: consensus error vs bits, and training accuracy vs MB and time."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._markdown import block, fill
from experiments.suite.runs import BASE, QUICK_BASE
from experiments.suite.tables import _pct, build_csv, build_table, header

from .tables import TARGETS, TEXT, consensus_csv, consensus_table, plots, reach_table
from .tables import training_target, verdict

#: (label, consensus spec, training spec) run on every graph; push-sum on the directed schedule only.
ALGORITHMS = (
    ("exact gossip", "exact", "exact"),
    ("PowerGossip r1", "powergossip:rank=1,iters=1,warm=true", "powergossip:rank=1,iters=1"),
)
PUSHSUM = ("push-sum", "pushsum", "pushsum")


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


def origin(rows: Rows) -> Optional[Dict[str, Any]]:
    """The older program's page-level figures, when every row was converted from its output."""
    origins = {json.dumps(r.origin, sort_keys=True) for r in rows.records}
    return rows.records[0].origin if len(origins) == 1 and rows.records[0].origin else None


def render(rows: Rows) -> Outputs:
    """dynamic.md, its two CSVs, dynamic.json and the two plots."""
    from gossip_powersgd.metrics import bits_to_reach, error_at_bits

    p = setting(rows.quick)
    stored = [r for r in rows.records if r.config["section"] == "consensus"]
    consensus = [r.row for r in stored]
    training = [r.row for r in rows.records if r.config["section"] == "training"]
    old = origin(rows) or {}
    seconds = old.get("seconds", sum(r.seconds for r in rows.records))
    consensus_seconds = old.get("consensus_seconds", sum(r.seconds for r in stored))
    shown = []
    for r in consensus:
        if "history" in r:
            h, at = r["history"], {b: error_at_bits(r["history"], b) for b in p["budgets"]}
            at = {b: None if e is None else e / r["error0"] for b, e in at.items()}
            r = dict(r, at_budget=at, to_reach={t: bits_to_reach(h, t) for t in TARGETS})
        shown.append(r)
    target = training_target(training)
    text = page(shown, training, p, target, made_by(rows), seconds, consensus_seconds)
    data = {"command": old.get("command", rows.command), "seconds": seconds, "plan": p}
    data.update(consensus=consensus, training=training)
    return {
        "dynamic.md": text,
        "dynamic_consensus.csv": consensus_csv(shown, p["budgets"]),
        "dynamic_training.csv": build_csv(training),
        "dynamic.json": json.dumps(data, indent=1, default=str) + "\n",
        **plots(shown, training, p),
    }


def page(consensus, training, p, target, generated: str, seconds: float, consensus_s: float) -> str:
    """dynamic.md (its text: page.md beside this file) from the rows of both sections."""
    data, n = QUICK_BASE if p["quick"] else BASE, 4 if p["quick"] else 16
    running = TEXT["running"].format(minutes=seconds / 60, consensus_minutes=consensus_s / 60)
    title = f"Gossip on graphs that change every step, {n} peers" + " (--quick)" * p["quick"]
    reach = [] if target is None else block(TEXT["reach"].format(target=_pct(target)) + "\n\n")
    text = fill(
        TEXT["page"],
        **p,
        **data,
        header=header(title, "", seconds, running, generated=generated),
        verdict=verdict(consensus, training, p, target),
        stop=min(TARGETS) / 2,
        consensus=block(consensus_table(consensus, p["budgets"])),
        n=n,
        eval_every=max(1, p["epochs"] // 10),
        training=block(build_table(training)),
        reach=reach + block(reach_table(training, target) if reach else ""),
    )
    return text + "\n"


PAGE = register(
    Page(
        name="dynamic",
        title="graphs that change every step (one-peer exponential, matchings) vs ring and torus, 16 peers",
        plan=plan,
        row=row,
        render=render,
    )
)
