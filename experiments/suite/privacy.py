"""`python -m experiments.suite privacy`: accuracy vs epsilon for five gossip algorithms under
per-peer DP-SGD, in the regime where DP learns (privacy_dp_sweep.md's: its constants are
imported), each run evaluated at every quarter (the plateau check); the page, its CSV and a plot
of accuracy against epsilon per algorithm."""

from __future__ import annotations

import csv
import io
import math
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from gossip_powersgd.utils import atomic_write

from experiments.privacy_attacks.dp_sweep import BASE as REGIME
from experiments.privacy_attacks.dp_sweep import CHOSEN, NONPRIVATE, budget_text, dp_epochs
from experiments.privacy_attacks.measure import NONPRIVATE_LR

from .runs import QUICK_BASE, log, measurements
from .tables import _pct, generated_sentence, header

#: (label, spec): the algorithms compared. Choco sign's γ = 1.0 is what the training page's sweep
#: chose on ring:8 iid (experiments/results/training.md).
ALGORITHMS = (
    ("exact gossip", "exact"),
    ("PowerGossip r1", "powergossip:rank=1,iters=1"),
    ("PowerGossip r4", "powergossip:rank=4,iters=1"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
    ("all-reduce", "allreduce"),
)
#: Target epsilons; None is the non-private baseline (epsilon = infinity).
EPSILONS = (1.0, 3.0, 8.0, None)
#: iid only: privacy_dp_sweep.md chose its regime on iid shards (a Dirichlet partition gives the
#: peers different sampling rates, and the smallest shard sets everyone's sigma).
PARTITIONS = ("iid",)
_, NP_BATCH, _, _, NP_EPOCHS, _ = NONPRIVATE
_, DP_BATCH, DP_LR, CLIP, _, _ = CHOSEN
DELTA = 1e-5
#: Every row runs with these seeds (mean and std over them on the page).
SEEDS = (0, 1, 2)


def run_private(overrides: Dict[str, Any], quick: bool) -> Dict[str, Any]:
    """One run on every peer (threads); the training suite's measurements plus epsilon and the
    averaged model's accuracy at three quarters of the run."""
    from gossip_powersgd import run

    result = run(dict(QUICK_BASE if quick else REGIME, **overrides))
    summary = result.summary
    stats = [result.stats[rank] for rank in sorted(result.stats)]
    m = measurements(summary, stats, result.wall_seconds)
    epsilons = [math.inf if e == "inf" else float(e) for e in summary.get("epsilon", [math.inf])]
    three = [
        r["test_acc_avg_model"]
        for r in result.evals
        if round(4 * r["epoch"] / result.config.epochs) == 3
    ]
    m.update(
        acc_3q=three[-1] if three else None,
        # (epoch, consensus distance) at every evaluation: how far the models drift over time
        consensus_history=[
            (r["epoch"], r["consensus_distance"])
            for r in result.evals
            if r.get("consensus_distance") is not None
        ],
        consensus=summary.get("final_consensus_distance"),
        eps_min=min(epsilons),
        eps_max=max(epsilons),
        sigma=summary.get("noise_multiplier"),
        delta=summary.get("delta"),
        q_min=min(summary.get("sample_rate", [math.nan])),
        q_max=max(summary.get("sample_rate", [math.nan])),
    )
    return m


def _attempt(label, spec, partition, target, seed, plan, extra=None) -> Dict[str, Any]:
    """One row: `spec` trained in the plan's regime (DP at `target` epsilon, or none), with the
    config keys of `extra` on top (a variant of the regime, e.g. dp_exchanged_subspace)."""
    private = target is not None
    # the private rows' budget: --epochs if given, else the one of the row's epsilon
    epochs = (plan["dp_epochs"] or dp_epochs(target)) if private else plan["epochs"]
    overrides = dict(
        topology=plan["topology"],
        partition=partition,
        epochs=epochs,
        eval_every=max(1, epochs // 4),  # quarters: the plateau check
        seed=seed,
        algorithm=spec,
        warmup_epochs=plan["warmup"],
        batch_size=plan["dp_batch" if private else "batch"],
        lr=plan["dp_lr" if private else "lr"],
        # a loaded shared machine can stall a peer thread for minutes: wait, not fail
        comm_timeout=600.0,
    )
    overrides.update(extra or {})
    if private:
        # the page reports every peer's epsilon and rate: released to the experimenter
        overrides.update(
            dp_target_epsilon=target,
            dp_max_grad_norm=CLIP,
            dp_delta=DELTA,
            release_peer_statistics=True,
        )
    row = dict(label=label, spec=spec, partition=partition, target=target, seed=seed)
    log(f"{label} {partition} target ε {target} seed {seed}")
    try:
        row.update(run_private(overrides, plan["quick"]))
    except Exception as exc:  # a failing run is a row saying so, not a lost page
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
        log(f"  FAILED: {row['error']}")
        return row
    log(
        f"  acc {row['acc_avg']:.4f}  ε [{row['eps_min']:.3g}, {row['eps_max']:.3g}]  "
        f"{row['run_seconds']:.1f} s"
    )
    return row


def privacy_plan(quick: bool, epochs: Optional[int] = None) -> Dict[str, Any]:
    """The page's plan; `epochs` overrides the regime's (both the private and the non-private
    rows')."""
    if quick:
        return dict(
            quick=True,
            topology="ring:4",
            epochs=epochs or 1,
            dp_epochs=epochs or 1,
            batch=QUICK_BASE["batch_size"],
            lr=QUICK_BASE["lr"],
            dp_batch=QUICK_BASE["batch_size"],
            dp_lr=QUICK_BASE["lr"],
            warmup=0,
            algorithms=ALGORITHMS[:2],
            epsilons=(3.0, None),
            partitions=("iid",),
            seeds=(0,),
        )
    return dict(
        quick=False,
        topology=REGIME["topology"],
        epochs=epochs or NP_EPOCHS,
        dp_epochs=epochs,  # None: each epsilon's budget (dp_sweep.dp_epochs)
        batch=NP_BATCH,
        lr=NONPRIVATE_LR,
        dp_batch=DP_BATCH,
        dp_lr=DP_LR,
        warmup=REGIME["warmup_epochs"],
        algorithms=ALGORITHMS,
        epsilons=EPSILONS,
        partitions=PARTITIONS,
        seeds=SEEDS,
    )


def run_all(tasks: Sequence[tuple], plan: Dict[str, Any], jobs: int = 1) -> List[Dict[str, Any]]:
    """`_attempt(*task, plan)` for every task, `jobs` at a time (spawned processes when more than
    one: `experiments.engine.pool.run_pool`), in the tasks' order."""
    from experiments.engine.pool import run_pool

    return run_pool(_attempt, [(*task, plan) for task in tasks], jobs)


def run_privacy(
    out: Path,
    quick: bool = False,
    epochs: Optional[int] = None,
    command: str = "python -m experiments.suite privacy",
    jobs: int = 1,
) -> Path:
    """Run every (algorithm, partition, epsilon) with every seed of the plan, `jobs` runs at
    once; write privacy.md, privacy.csv and privacy_accuracy_vs_epsilon.png under `out`."""
    if jobs < 1:
        raise SystemExit(f"error: --jobs {jobs}: give 1 or more runs at once")
    started = time.perf_counter()
    plan = privacy_plan(quick, epochs)
    cells = [
        (label, spec, partition, target)
        for partition in plan["partitions"]
        for target in plan["epsilons"]
        for label, spec in plan["algorithms"]
    ]
    tasks = [(*cell, seed) for cell in cells for seed in plan["seeds"]]
    runs = run_all(tasks, plan, jobs)
    n = len(plan["seeds"])
    rows = [combine(runs[i * n : (i + 1) * n]) for i in range(len(cells))]
    seconds = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "privacy.md", privacy_page(rows, plan, command, seconds))
    atomic_write(out / "privacy.csv", privacy_csv(rows))
    try:
        plot_privacy(rows, out / "privacy_accuracy_vs_epsilon.png")
    except Exception as exc:  # the table matters more than the picture
        log(f"plot failed: {exc}")
    log(f"wrote {out / 'privacy.md'} in {seconds:.0f} s")
    return out / "privacy.md"


def combine(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Seeds of one row: accuracies as mean and std (over the runs that finished)."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    out = dict(good[0], seeds=len(good))
    for key in ("acc_avg", "acc_local_mean", "acc_3q"):
        values = [float(r[key]) for r in good if r.get(key) is not None]
        if not values:
            out[key], out[key + "_std"] = None, None
            continue
        out[key] = statistics.fmean(values)
        out[key + "_std"] = statistics.stdev(values) if len(values) > 1 else None
    out["eps_max"] = max(r["eps_max"] for r in good)
    out["eps_min"] = min(r["eps_min"] for r in good)
    return out


def _eps(value: Optional[float]) -> str:
    return "∞" if value is None or math.isinf(value) else f"{value:.3g}"


TABLE = (
    "| partition | target ε | algorithm | seeds | epochs | averaged-model acc | at ¾ of the run | "
    "change over the last quarter (pp) | local acc mean | ε per peer [min, max] | σ | "
    "q per peer [min, max] | MB sent / peer |"
)


def table(rows: Sequence[Dict[str, Any]]) -> str:
    lines = [TABLE, "|" + "---|" * (TABLE.count("|") - 1)]
    for r in rows:
        head = (
            f"| {r['partition']} | {_eps(r['target'])} | {r['label']} | {r.get('seeds', 1)} | "
            f"{r.get('epochs', 'n/a')} |"
        )
        if "error" in r:
            lines.append(head + f" FAILED: {r['error'].replace('|', '/')} | | | | | | | |")
            continue
        private = r["target"] is not None
        three = r.get("acc_3q")
        lines.append(
            head
            + f" {_pct(r['acc_avg'], r.get('acc_avg_std'))} | "
            + ("n/a | n/a | " if three is None else f"{_pct(three)} | ")
            + ("" if three is None else f"{100 * (r['acc_avg'] - three):+.2f} | ")
            + f"{_pct(r['acc_local_mean'], r.get('acc_local_mean_std'))} | "
            f"[{_eps(r['eps_min'])}, {_eps(r['eps_max'])}] | "
            + (f"{r['sigma']:.3g}" if private else "—")
            + " | "
            + (f"[{r['q_min']:.3g}, {r['q_max']:.3g}]" if private else "—")
            + f" | {r['mb_per_peer']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _acc(rows, label, partition, target) -> Optional[float]:
    for r in rows:
        if (r["label"], r["partition"], r["target"]) == (
            label,
            partition,
            target,
        ) and "error" not in r:
            return r["acc_avg"]
    return None


def findings(rows: Sequence[Dict[str, Any]], plan: Dict[str, Any]) -> List[str]:
    """What the rows show: the cost of privacy per algorithm, measured, and where it differs."""
    lines = []
    private = [t for t in plan["epsilons"] if t is not None]
    for partition in plan["partitions"]:
        for label, _ in plan["algorithms"]:
            base = _acc(rows, label, partition, None)
            if base is None:
                continue
            drops = [(t, _acc(rows, label, partition, t)) for t in private]
            parts = [f"ε={_eps(t)}: {100 * (a - base):+.1f} pp" for t, a in drops if a is not None]
            lines.append(
                f"- {partition}, {label}: non-private {_pct(base)}; with DP "
                + ", ".join(parts)
                + "."
            )
    return lines


def privacy_page(rows, plan, command, seconds) -> str:
    data = QUICK_BASE if plan["quick"] else REGIME
    extra = (
        f"Setting: {data['dataset']}, model `{data['model']}`, {plan['topology']}, SGD"
        + (
            ""
            if plan["quick"]
            else f" momentum {data['momentum']}, cosine schedule with {plan['warmup']} warm-up "
            "epoch, the regime privacy_dp_sweep.md chose (8000 samples per peer; its constants "
            "are imported, not copied)"
        )
        + f". Non-private rows: batch {plan['batch']}, lr {plan['lr']}, {plan['epochs']} "
        f"epochs; private rows: expected batch {plan['dp_batch']}, lr {plan['dp_lr']}, "
        + (
            f"{plan['dp_epochs']} epochs"
            if plan["dp_epochs"]
            else f"{budget_text()} (privacy_dp_budget.md: at each ε the budget after which "
            "doubling the epochs no longer pays)"
        )
        + ". Every run is evaluated at each quarter: the columns at "
        f"¾ of the run and the change over its last quarter say whether it ended on a plateau. "
        f"DP: Poisson sampling of each peer's shard at q = batch / shard "
        f"size, per-example clipping C = {CLIP:g}, Gaussian noise on each peer's own "
        f"gradient before its optimizer step, RDP accountant, δ = {DELTA:g}; σ is computed "
        f"per run from the target ε so that the peer with the largest q ends at or just "
        f"below it (`dp_target_epsilon`). Target ∞ is the non-private recipe (shuffled "
        f"batches, no clipping). Noise and Poisson masks secret per peer (fresh OS "
        f"entropy); the peers' sizes and ε released to the experimenter "
        f"(`release_peer_statistics`). The same regime attacked by a curious neighbour, with "
        f"3 seeds per row: privacy_attacks.md."
    )
    text = header(
        "Differential privacy: accuracy vs ε" + (" (--quick)" if plan["quick"] else ""),
        command,
        seconds,
        extra,
        generated=generated_sentence(command, seconds),
    )
    text += (
        f"Every row: seeds {', '.join(map(str, plan['seeds']))} (mean ± std over them; a "
        "seed draws the model's initialisation and the data order, and each peer's DP noise is "
        "fresh secret entropy whatever the seed).\n\n"
    )
    text += "## Results\n\n" + table(rows) + "\n"
    text += "![accuracy vs epsilon](privacy_accuracy_vs_epsilon.png)\n\n"
    text += "## What the rows show\n\n" + "\n".join(findings(rows, plan)) + "\n\n"
    text += ANALYSIS
    return text


#: Why the algorithms react differently: the mechanism, stated once (the numbers are above).
ANALYSIS = """## Why DP hurts some algorithms more

- Every peer spends the same ε whatever the algorithm: the noise is added to each peer's own
  clipped gradient before anything is sent, and gossip is post-processing. The algorithms differ
  only in how they average that noise away. All-reduce averages all 8 peers' independent noise
  every step (its variance divided by 8); exact gossip averages only with 2 neighbours per step,
  so each model keeps more of its own noise and consensus takes several steps.
- Compressed gossip adds its own error on top: PowerGossip's rank-1 approximation of the model
  differences transmits only part of the difference between neighbours. Noise makes those
  differences larger and less low-rank (isotropic noise has no low-rank structure), so a rank-1
  message carries a smaller share of them and the peers' independent noise is averaged more
  slowly; Choco's sign message keeps every coordinate's direction and suffers less.
- A higher rank carries more of the difference per message: PowerGossip r4 sends 4 times r1's
  floats per exchange, and the rows show how much of r1's loss under DP that buys back.
- MB sent per peer does not depend on ε: DP changes what is sent, never how much.
"""


CSV_FIELDS = (
    "partition",
    "target",
    "label",
    "spec",
    "seeds",
    "acc_avg",
    "acc_avg_std",
    "acc_local_mean",
    "acc_3q",
    "eps_min",
    "eps_max",
    "sigma",
    "delta",
    "q_min",
    "q_max",
    "mb_per_peer",
    "steps",
    "epochs",
    "run_seconds",
    "error",
)


def privacy_csv(rows: Sequence[Dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    return buffer.getvalue()


def plot_privacy(rows: Sequence[Dict[str, Any]], path: Path) -> None:
    """Averaged-model accuracy against ε, one line per algorithm, one panel per partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    partitions = list(dict.fromkeys(r["partition"] for r in rows))
    fig, axes = plt.subplots(1, len(partitions), figsize=(6 * len(partitions), 4.2), squeeze=False)
    finite = [r["target"] for r in rows if r["target"] is not None]
    infinity = 2 * max(finite) if finite else 1.0  # where the non-private point is drawn
    for ax, partition in zip(axes.flat, partitions):
        for label in dict.fromkeys(r["label"] for r in rows):
            points = sorted(
                (infinity if r["target"] is None else r["target"], 100 * r["acc_avg"])
                for r in rows
                if r["label"] == label and r["partition"] == partition and "error" not in r
            )
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_xscale("log")
        ticks = sorted(set(finite)) + [infinity]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks[:-1]] + ["∞"])
        ax.set_xlabel("target ε (δ = 1e-5)")
        ax.set_ylabel("averaged-model test accuracy (%)")
        ax.set_title(partition)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
