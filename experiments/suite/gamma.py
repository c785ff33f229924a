"""`python -m experiments.suite gamma`: is PowerGossip's untuned γ (the topology's) near the best,
next to Choco top-k whose γ must be tuned? The page, CSV and plot, from the rows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

from gossip_powersgd.utils import atomic_write

from .runs import BASE, QUICK_BASE, attempt, log
from .tables import _algorithm_name, _pct, build_csv, build_table, header


def run_gamma(
    out: Path,
    quick: bool = False,
    epochs: int = 5,
    command: str = "python -m experiments.suite gamma",
) -> Path:
    import topologies

    started = time.perf_counter()
    topology = "ring:4" if quick else "ring:8"
    epochs = 1 if quick else epochs
    topo_gamma = topologies.parse(topology).gamma
    pg_grid = [0.25, 0.5, 1.0, topo_gamma, 1.5 * topo_gamma]
    choco_grid = [0.05] if quick else [0.02, 0.05, 0.1, 0.2, 0.4]
    if quick:
        pg_grid = [0.5, topo_gamma]
    base = dict(topology=topology, partition="iid", epochs=epochs, eval_every=epochs, seed=0)
    rows = []
    for g in pg_grid:
        label = "PowerGossip r1" + (" (topology γ)" if g == topo_gamma else "")
        rows.append(attempt(label, f"powergossip:rank=1,iters=1,gamma={g!r}", base, quick, gamma=g))
    for g in choco_grid:
        rows.append(
            attempt(
                "Choco top-k 1%", f"choco:compressor=topk:0.01,gamma={g!r}", base, quick, gamma=g
            )
        )
    seconds = time.perf_counter() - started
    text = header(
        "γ sensitivity: PowerGossip (untuned) vs Choco top-k" + (" (--quick)" if quick else ""),
        command,
        seconds,
        f"{topology}, iid, {(QUICK_BASE if quick else BASE)['dataset']} / "
        f"`{(QUICK_BASE if quick else BASE)['model']}`, {epochs} epochs per run, seed 0, the "
        "training recipe of training.md. PowerGossip's default γ is the topology's "
        f"2/(λmin+λmax) of I−W = {topo_gamma:.4g}.",
    )
    text += (
        "## Runs\n\n"
        + build_table(rows)
        + "\n## Verdict\n\n"
        + "\n".join(gamma_verdict(rows, topo_gamma))
        + "\n\nData: [gamma.csv](gamma.csv), plot [gamma.png](gamma.png).\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "gamma.md", text)
    atomic_write(out / "gamma.csv", build_csv(rows))
    try:
        plot_gamma(rows, topo_gamma, out / "gamma.png")
    except Exception as exc:
        log(f"plot failed: {exc}")
    log(f"wrote {out / 'gamma.md'} in {seconds:.0f} s")
    return out / "gamma.md"


def gamma_verdict(rows: Sequence[Dict[str, Any]], topo_gamma: float) -> List[str]:
    lines = []
    pg = [r for r in rows if _algorithm_name(r) == "powergossip" and "error" not in r]
    ch = [r for r in rows if _algorithm_name(r) == "choco" and "error" not in r]
    if pg:
        best = max(pg, key=lambda r: r["acc_avg"])
        at = next((r for r in pg if r["gamma"] == topo_gamma), None)
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


def plot_gamma(rows, topo_gamma, path: Path) -> None:
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
