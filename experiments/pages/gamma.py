"""`python -m experiments gamma`: is PowerGossip's untuned γ (the topology's) near the best, next to
Choco top-k whose γ must be tuned? A sweep of γ for both (ring:8 iid, 10 epochs, the training
page's recipe); the page, its CSV and a plot of accuracy against γ."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._figures import png, pyplot
from experiments.pages._markdown import snippets
from experiments.pages._suite_rows import suite_row, suite_run
from experiments.suite.runs import BASE, QUICK_BASE
from experiments.suite.tables import _algorithm_name, _pct, build_csv, build_table, header

#: (topology, epochs per run) of the page, and of --quick.
SETTING = {False: ("ring:8", 10), True: ("ring:4", 1)}
#: (algorithm, run key prefix, label, spec) of the two sweeps, in the table's order.
SWEEPS = (
    ("powergossip", "powergossip", "PowerGossip r1", "powergossip:rank=1,iters=1,gamma={gamma}"),
    ("choco", "choco-topk", "Choco top-k 1%", "choco:compressor=topk:0.01,gamma={gamma}"),
)
#: The page's text (gamma.md beside this file).
TEXT = snippets(__file__, "gamma.md")


def _topology_gamma(topology: str) -> float:
    import topologies

    return topologies.parse(topology).gamma


def grids(quick: bool) -> Dict[str, List[float]]:
    """The γ values: PowerGossip's around the topology's γ, Choco top-k's on a log grid."""
    g = _topology_gamma(SETTING[quick][0])
    if quick:
        return {"powergossip": [0.5, g], "choco": [0.05]}
    return {"powergossip": [0.25, 0.5, 1.0, g, 1.5 * g], "choco": [0.02, 0.05, 0.1, 0.2, 0.4]}


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """Every γ of both sweeps, PowerGossip's first (the table's order)."""
    topology, epochs = SETTING[quick]
    topo_gamma = _topology_gamma(topology)
    train = dict(QUICK_BASE if quick else BASE, topology=topology, partition="iid")
    train.update(epochs=epochs, eval_every=epochs)
    train.pop("seed")
    runs = []
    for name, prefix, label, spec in SWEEPS:
        for g in grids(quick)[name]:
            at = " (topology γ)" if name == "powergossip" and g == topo_gamma else ""
            key = f"{prefix}/gamma={g:.9g}"  # stable where γ's last bits differ across machines
            runs.append(suite_run(key, label + at, dict(train, algorithm=spec), 0, gamma=g))
    return runs


def render(rows: Rows) -> Outputs:
    """gamma.md (its text: gamma.md beside this file), gamma.csv and gamma.png from the rows."""
    topology, epochs = SETTING[rows.quick]
    gamma = _topology_gamma(topology)
    data = [dict(r, gamma_text=f"{r['gamma']:{'g' if 'error' in r else '.3g'}}") for r in rows.data]
    recipe = QUICK_BASE if rows.quick else BASE
    setting = TEXT["setting"].format(**recipe, topology=topology, epochs=epochs, gamma=gamma)
    title = "γ sensitivity: PowerGossip (untuned) vs Choco top-k" + " (--quick)" * rows.quick
    text = TEXT["page"].format(
        header=header(title, made_by(rows), setting),
        table=build_table(data),
        verdict="\n".join(gamma_verdict(data, gamma)),
    )
    return {
        "gamma.md": text + "\n",
        "gamma.csv": build_csv(data),
        "gamma.png": plot_gamma(data, gamma),
    }


def _good(rows: Sequence[Dict[str, Any]], name: str) -> List[Dict[str, Any]]:
    """The rows of algorithm `name` that finished."""
    return [r for r in rows if _algorithm_name(r) == name and "error" not in r]


def gamma_verdict(rows: Sequence[Dict[str, Any]], gamma: float) -> List[str]:
    """PowerGossip at the topology's γ vs its sweep's best, its spread, Choco's, the failures."""
    lines, failed = [], [r for r in rows if "error" in r]
    pg, ch = (_good(rows, name) for name in ("powergossip", "choco"))
    if pg:
        best = max(pg, key=lambda r: r["acc_avg"])
        at = next((r for r in pg if r["label"].endswith("(topology γ)")), None)
        if at is not None:
            gap = 100 * (best["acc_avg"] - at["acc_avg"])
            near = "near the best (within 1 pp)" if gap <= 1.0 else "NOT within 1 pp of the best"
            cells = dict(at=_pct(at["acc_avg"]), best=_pct(best["acc_avg"]), gap=gap, near=near)
            lines.append(TEXT["at"].format(**cells, gamma=gamma, best_gamma=best["gamma"]))
        spread = 100 * (best["acc_avg"] - min(r["acc_avg"] for r in pg))
        lines.append(TEXT["spread"].format(spread=spread))
    if ch:
        best, worst = (f(ch, key=lambda r: r["acc_avg"]) for f in (max, min))
        cells = dict(best=_pct(best["acc_avg"]), worst=_pct(worst["acc_avg"]))
        cells.update(best_gamma=best["gamma"], worst_gamma=worst["gamma"])
        moves = 100 * (best["acc_avg"] - worst["acc_avg"])
        lines.append(TEXT["choco"].format(**cells, moves=moves))
    if failed:
        runs = "; ".join(f"{r['label']} γ = {r['gamma']:.3g}: {r['error'][:60]}" for r in failed)
        lines.append(TEXT["failed"].format(count=len(failed), runs=runs))
    return lines


def plot_gamma(rows: Sequence[Dict[str, Any]], topo_gamma: float) -> bytes:
    """Averaged-model accuracy against γ for both algorithms (PNG bytes)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, _, legend, _ in SWEEPS:
        pts = sorted((r["gamma"], 100 * r["acc_avg"]) for r in _good(rows, name))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=legend)
    ax.axvline(topo_gamma, color="gray", ls="--", lw=1, label=f"topology γ = {topo_gamma:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("γ")
    ax.set_ylabel("averaged-model test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return png(fig)


TITLE = "γ sensitivity: PowerGossip at the topology's γ vs a γ sweep, next to Choco top-k"
PAGE = register(Page(name="gamma", title=TITLE, plan=plan, row=suite_row, render=render))
