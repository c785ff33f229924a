"""`python -m experiments privacy`: accuracy vs ε for five gossip algorithms under per-peer DP-SGD
in the privacy pages' regime (`_privacy`), a row per (algorithm, ε) over SEEDS."""

from __future__ import annotations

import itertools
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import _figures, register
from experiments.pages._markdown import csv_text, fill, mean_sd, snippets
from experiments.pages import _privacy as regime
from experiments.suite.runs import QUICK_BASE
from experiments.suite.tables import _pct, header

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
PARTITION = "iid"
#: Every row runs with these seeds (mean and std over them on the page).
SEEDS = (0, 1, 2)
#: --quick: (algorithms, epsilons, seeds) on the regime's tiny problem.
QUICK = (ALGORITHMS[:2], (3.0, None), (0,))
CSV_FIELDS = (
    "partition", "target", "label", "spec", "seeds", "acc_avg", "acc_avg_std", "acc_local_mean",
    "acc_3q", "eps_min", "eps_max", "sigma", "delta", "q_min", "q_max", "mb_per_peer", "steps",
    "epochs", "run_seconds", "error",
)  # fmt: skip
TEXT = snippets(__file__, "privacy.md")


def _eps(value: Optional[float]) -> str:
    return "∞" if value is None or math.isinf(value) else f"{value:.3g}"


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    algorithms, epsilons, seeds = QUICK if quick else (ALGORITHMS, EPSILONS, SEEDS)
    recipe = regime.recipe(quick)
    runs = []
    for target, (label, spec) in itertools.product(epsilons, algorithms):
        train = regime.train_config(recipe, spec, target, PARTITION)
        config = dict(label=label, spec=spec, partition=PARTITION, target=target)
        config.update(seeds=list(seeds), train=train)
        key = f"{PARTITION}/eps={_eps(target)}/{label}"
        runs.append(Run(key, config, cost=len(seeds) * train["epochs"]))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """The row's seeds: accuracies' mean and std, ε's [min, max], the rest the first run's."""
    runs = [regime.dp_row(run.config, seed) for seed in run.config["seeds"]]
    good = [r for r in runs if "error" not in r]
    if not good:
        return {k: v for k, v in runs[0].items() if k in CSV_FIELDS}
    out = dict(good[0], seeds=len(good))
    for key in ("acc_avg", "acc_local_mean", "acc_3q"):
        values = [float(r[key]) for r in good if r.get(key) is not None]
        out[key], out[key + "_std"] = mean_sd(values) if values else (None, None)
    out["eps_max"] = max(r["eps_max"] for r in good)
    out["eps_min"] = min(r["eps_min"] for r in good)
    return {k: out[k] for k in CSV_FIELDS + ("acc_local_mean_std",) if k in out}


def _line(r: Dict[str, Any]) -> str:
    """A row of the results table (privacy.md's `row`, or `failed`)."""
    words = dict(r, eps=_eps(r["target"]), seeds=r.get("seeds", 1), epochs=r.get("epochs", "n/a"))
    if "error" in r:
        return TEXT["failed"].format_map(dict(words, error=r["error"].replace("|", "/"))) + "\n"
    private, three = r["target"] is not None, r.get("acc_3q")
    words.update(acc=_pct(r["acc_avg"], r.get("acc_avg_std")), at_3q=_pct(three))
    words["change"] = "n/a" if three is None else f"{100 * (r['acc_avg'] - three):+.2f}"
    words["local"] = _pct(r["acc_local_mean"], r.get("acc_local_mean_std"))
    words["eps_range"] = f"[{_eps(r['eps_min'])}, {_eps(r['eps_max'])}]"
    words["sigma"] = f"{r['sigma']:.3g}" if private else "—"
    words["q"] = f"[{r['q_min']:.3g}, {r['q_max']:.3g}]" if private else "—"
    return TEXT["row"].format_map(words) + "\n"


def findings(rows: Sequence[Dict[str, Any]], algorithms, epsilons) -> List[str]:
    """What the rows show: the cost of privacy per algorithm, measured."""
    acc = {(r["label"], r["target"]): r["acc_avg"] for r in rows if "error" not in r}
    lines = []
    for label, _ in algorithms:
        base = acc.get((label, None))
        if base is None:
            continue
        drops = [(t, acc.get((label, t))) for t in epsilons if t is not None]
        parts = [f"ε={_eps(t)}: {100 * (a - base):+.1f} pp" for t, a in drops if a is not None]
        words = dict(partition=PARTITION, label=label, base=_pct(base), drops=", ".join(parts))
        lines.append(TEXT["finding"].format(**words))
    return lines


def render(rows: Rows) -> Outputs:
    quick = rows.quick
    algorithms, epsilons, seeds = QUICK if quick else (ALGORITHMS, EPSILONS, SEEDS)
    plan_, data = regime.recipe(quick), rows.data
    base = QUICK_BASE if quick else regime.BASE
    momentum = "" if quick else TEXT["momentum"].format(momentum=base["momentum"], **plan_)
    budget = f"{plan_['dp_epochs']} epochs" if plan_["dp_epochs"] else None
    budget = budget or TEXT["budget"].format(budget=regime.budget_text())
    words = dict(plan_, dataset=base["dataset"], model=base["model"], momentum=momentum)
    extra = TEXT["setting"].format(**words, budget=budget, clip=regime.CLIP, delta=regime.DELTA)
    title = "Differential privacy: accuracy vs ε" + (" (--quick)" if quick else "")
    text = header(title, made_by(rows), extra)
    words = dict(seeds=", ".join(map(str, seeds)), rows="".join(map(_line, data)))
    words["findings"] = "\n".join(findings(data, algorithms, epsilons))
    text += fill(TEXT["page"] + "\n", **words)
    cells = [["" if r.get(k) is None else r.get(k) for k in CSV_FIELDS] for r in data]
    return {
        "privacy.md": text,
        "privacy.csv": csv_text(CSV_FIELDS, cells),
        "privacy_accuracy_vs_epsilon.png": plot(data),
    }


def plot(rows: Sequence[Dict[str, Any]]) -> bytes:
    """Averaged-model accuracy against ε, one line per algorithm (the one partition's panel)."""
    plt = _figures.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    finite = [r["target"] for r in rows if r["target"] is not None]
    infinity = 2 * max(finite) if finite else 1.0  # where the non-private point is drawn
    for label in dict.fromkeys(r["label"] for r in rows):
        points = sorted(
            (infinity if r["target"] is None else r["target"], 100 * r["acc_avg"])
            for r in rows
            if r["label"] == label and "error" not in r
        )
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ticks = sorted(set(finite)) + [infinity]
    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks[:-1]] + ["∞"])
    ax.set(xlabel="target ε (δ = 1e-5)", ylabel="averaged-model test accuracy (%)", title=PARTITION)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _figures.png(fig, 120)


TITLE = "accuracy vs ε under per-peer DP-SGD, five gossip algorithms (privacy_dp_sweep's regime)"
PAGE = register(Page("privacy", TITLE, plan, row, render))
