"""`python -m experiments consensus`: the PowerGossip paper's consensus experiment (sec. 5) on 25
problem x topology instances, 3 seeds, a winner map. A run is one instance (`instance`, `measure`);
the renderer writes the page (`page`), the winner map and each instance's files (`files`)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register

from .files import CURVES, curves_bytes, folder, heat_map, plots, run_file, summary_json
from .files import table_csv
from .instance import GAMMAS, INSTANCES, settings, with_cells
from .measure import BUDGETS, STEP_CAP, STOP_RELATIVE, reach_cells, summarize

#: (instances, γ grid, budgets) of the page, and of --quick: two tiny instances (seconds), the
#: page's code paths all taken.
SETTINGS = {
    False: (INSTANCES, GAMMAS, BUDGETS),
    True: (
        (("ring:4", "matrix:20", "full"), ("ring:4", "lowrank:r=2,sigma=0.1,n=20", "added")),
        (0.1, 1.0),
        (1e4, 3e4, 1e5),
    ),
}


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """One run per instance (its algorithms, seeds, γ grid, budgets), in the page's order."""
    instances, gammas, budgets = SETTINGS[quick]
    runs = []
    for topology, problem, kind in instances:
        config = {"topology": topology, "problem": problem, **settings(kind, problem)}
        config.update(gammas=list(gammas), dtype="float64", budgets=list(budgets))
        config.update(stop_relative=STOP_RELATIVE)
        cost = (2 if kind == "full" else 1) * (2 if topology.startswith("torus") else 1)
        runs.append(Run(f"{topology}/{problem}", config, cost=cost))
    return runs


def row(run: Run) -> Dict[str, Any]:
    import torch

    from experiments.engine import ROOT

    from .instance import run_instance

    torch.set_num_threads(1)
    return run_instance(**run.config, models_dir=str(ROOT / "runs" / "consensus" / "models"))


def load_instance(record, command: str) -> Dict[str, Any]:
    """The instance as the page and its files read it, from its stored row."""
    c, r = record.config, record.row
    budgets = [float(b) for b in c["budgets"]]
    results = []
    for run in r["runs"]:
        run = with_cells(run, budgets)
        last = run["history"][-1]
        run.update(steps=last["step"], bits_per_peer=last["bits_per_peer"], dtype=c["dtype"])
        run.update(file=run_file(run["spec"], run["seed"]), reach=reach_cells(run["history"]))
        results.append(run)
    # summary.json's fields, in its order (the settings every instance of the page shares fixed)
    out = dict(topology=c["topology"], weights="default", gamma_topology=r["gamma_topology"])
    out.update(problem=c["problem"], backend="local", budgets=budgets, gammas=c["gammas"])
    out.update(sweep=True, topk_ratio=r["topk_ratio"], max_bits=budgets[-1], max_steps=STEP_CAP)
    out.update(seconds=r["seconds"], screen_bits=budgets[-2], finalists=1, seeds=c["seeds"])
    out.update(dtype=c["dtype"], stop_relative=c["stop_relative"])
    out["command"] = r.get("command", command)  # a converted row: the old program's command
    out.update(finished=record.finished, commit=record.commit, results=results)
    summary = summarize([x for x in results if x["seed"] == 0], budgets)
    return dict(out, summary=summary, folder=folder(c["topology"], c["problem"]))


def render(rows: Rows) -> Outputs:
    """consensus.md, the winner map, and every instance's table.csv, curves, summary and plots."""
    from .page import page

    instances = [load_instance(record, rows.command) for record in rows.records]
    meta = {k: rows.records[0].row[k] for k in ("cpu_count", "machine")}
    meta["seconds"] = sum(r["seconds"] for r in instances)
    out: Outputs = {"consensus.md": page(instances, made_by(rows), meta)}
    out["consensus/winner_map.png"] = heat_map(instances, instances[0]["budgets"])
    for x in instances:
        out[f"{x['folder']}/{CURVES}"] = curves_bytes(x)
        out[f"{x['folder']}/table.csv"] = table_csv(x)
        out[f"{x['folder']}/summary.json"] = summary_json(x)
        out.update({f"{x['folder']}/{name}": data for name, data in plots(x).items()})
    return out


TITLE = (
    "consensus (averaging only): error at matched bits, 25 problem x topology instances, winner map"
)
PAGE = register(Page(name="consensus", title=TITLE, plan=plan, row=row, render=render))
