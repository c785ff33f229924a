"""`python -m experiments gamma`: is PowerGossip's untuned γ (the topology's) near the best, next to
Choco top-k whose γ must be tuned? A sweep of γ for both (ring:8 iid, 10 epochs, the training
page's recipe); the page, its CSV and a plot of accuracy against γ."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._figures import png
from experiments.pages._suite_rows import suite_row, suite_run
from experiments.suite.runs import BASE, QUICK_BASE
from experiments.suite.tables import _algorithm_name, _pct, build_csv, build_table, header

#: (topology, epochs per run) of the page, and of --quick.
SETTING = {False: ("ring:8", 10), True: ("ring:4", 1)}


def _topology_gamma(topology: str) -> float:
    import topologies

    return topologies.parse(topology).gamma


def grids(quick: bool) -> Dict[str, List[float]]:
    """The γ values of each algorithm: PowerGossip around the topology's γ, Choco top-k on a
    log grid."""
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
    for g in grids(quick)["powergossip"]:
        label = "PowerGossip r1" + (" (topology γ)" if g == topo_gamma else "")
        spec = "powergossip:rank=1,iters=1,gamma={gamma}"
        key = f"powergossip/gamma={g:.9g}"  # stable where γ's last bits differ across machines
        runs.append(suite_run(key, label, dict(train, algorithm=spec), 0, gamma=g))
    for g in grids(quick)["choco"]:
        spec = "choco:compressor=topk:0.01,gamma={gamma}"
        key = f"choco-topk/gamma={g:.9g}"
        runs.append(suite_run(key, "Choco top-k 1%", dict(train, algorithm=spec), 0, gamma=g))
    return runs


def _with_gamma_text(row: Dict[str, Any]) -> Dict[str, Any]:
    gamma = row["gamma"]
    return dict(row, gamma_text=f"{gamma:g}" if "error" in row else f"{gamma:.3g}")


def render(rows: Rows) -> Outputs:
    """gamma.md, gamma.csv and gamma.png from the rows."""
    quick = rows.quick
    topology, epochs = SETTING[quick]
    topo_gamma = _topology_gamma(topology)
    data = [_with_gamma_text(row) for row in rows.data]
    recipe = QUICK_BASE if quick else BASE
    text = header(
        "γ sensitivity: PowerGossip (untuned) vs Choco top-k" + (" (--quick)" if quick else ""),
        rows.command,
        0.0,
        f"{topology}, iid, {recipe['dataset']} / `{recipe['model']}`, {epochs} epochs per run, "
        "seed 0, the training recipe of training.md. PowerGossip's default γ is the topology's "
        f"2/(λmin+λmax) of I−W = {topo_gamma:.4g}.",
        generated=made_by(rows),
    )
    text += (
        "## Runs\n\n"
        + build_table(data)
        + "\n## Verdict\n\n"
        + "\n".join(gamma_verdict(data, topo_gamma))
        + "\n\nData: [gamma.csv](gamma.csv), plot [gamma.png](gamma.png).\n"
    )
    return {
        "gamma.md": text,
        "gamma.csv": build_csv(data),
        "gamma.png": plot_gamma(data, topo_gamma),
    }


def gamma_verdict(rows: Sequence[Dict[str, Any]], topo_gamma: float) -> List[str]:
    lines = []
    pg = [r for r in rows if _algorithm_name(r) == "powergossip" and "error" not in r]
    ch = [r for r in rows if _algorithm_name(r) == "choco" and "error" not in r]
    if pg:
        best = max(pg, key=lambda r: r["acc_avg"])
        at = next((r for r in pg if r["label"].endswith("(topology γ)")), None)
        if at is not None:
            gap = 100 * (best["acc_avg"] - at["acc_avg"])
            lines.append(
                f"- PowerGossip r1 at the topology's γ = {topo_gamma:.3g}: {_pct(at['acc_avg'])}; "
                f"best of the sweep {_pct(best['acc_avg'])} at γ = {best['gamma']:.3g} "
                f"({gap:.2f} pp better). The untuned value is "
                f"{'near the best (within 1 pp)' if gap <= 1.0 else 'NOT within 1 pp of the best'}."
            )
        spread = 100 * (best["acc_avg"] - min(r["acc_avg"] for r in pg))
        lines.append(f"- PowerGossip spread over its sweep (best − worst): {spread:.2f} pp.")
    if ch:
        best = max(ch, key=lambda r: r["acc_avg"])
        worst = min(ch, key=lambda r: r["acc_avg"])
        lines.append(
            f"- Choco top-k 1%: best {_pct(best['acc_avg'])} at γ = {best['gamma']:g}, worst "
            f"{_pct(worst['acc_avg'])} at γ = {worst['gamma']:g}: tuning moves it by "
            f"{100 * (best['acc_avg'] - worst['acc_avg']):.2f} pp."
        )
    failed = [r for r in rows if "error" in r]
    if failed:
        lines.append(
            f"- {len(failed)} run(s) failed or diverged (see the table): "
            + "; ".join(f"{r['label']} γ = {r['gamma']:.3g}: {r['error'][:60]}" for r in failed)
            + "."
        )
    return lines


def plot_gamma(rows: Sequence[Dict[str, Any]], topo_gamma: float) -> bytes:
    """Averaged-model accuracy against γ for both algorithms (PNG bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, legend in (("powergossip", "PowerGossip r1"), ("choco", "Choco top-k 1%")):
        pts = sorted(
            (r["gamma"], 100 * r["acc_avg"])
            for r in rows
            if _algorithm_name(r) == name and "error" not in r
        )
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


PAGE = register(
    Page(
        name="gamma",
        title="γ sensitivity: PowerGossip at the topology's γ vs a γ sweep, next to Choco top-k",
        plan=plan,
        row=suite_row,
        render=render,
    )
)
