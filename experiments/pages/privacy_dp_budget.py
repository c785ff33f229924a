"""`python -m experiments privacy_dp_budget`: does the DP regime of the privacy pages train to a
plateau?

Under a cosine schedule the learning rate reaches 0 at the end of every run, so a flat last
quarter says nothing: the test is the final accuracy against the training budget at the same
target epsilon. This page runs the chosen regime (`_privacy`) at 15, 30 and 60 epochs for exact
gossip at target epsilon 8, 3 and 1 and PowerGossip r1 and r4 at epsilon 8, and names, for each
epsilon, the smallest budget after which doubling gains less than THRESHOLD_PP on every cell of
that epsilon: the budget of the privacy pages' DP rows at that epsilon (`_privacy.DP_EPOCHS`,
which a test holds equal to the committed page's verdicts).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages import _privacy as regime

#: (label, algorithm spec, target epsilon): exact gossip at the headline epsilon and lower (more
#: noise per step: a plateau there may need another budget), PowerGossip at rank 1 (the
#: algorithm DP hurts most at 15 epochs) and rank 4.
CELLS = (
    ("exact gossip", "exact", 8.0),
    ("PowerGossip r4", "powergossip:rank=4,iters=1", 8.0),
    ("PowerGossip r1", "powergossip:rank=1,iters=1", 8.0),
    ("exact gossip", "exact", 3.0),
    ("exact gossip", "exact", 1.0),
)
#: Epochs per run, each the double of the one before (privacy_dp_sweep.md chose its regime at 15).
BUDGETS = (15, 30, 60)
#: A doubling that gains less than this (percentage points of averaged-model accuracy) no longer
#: pays. Declared before the runs: below the seed-to-seed standard deviation that privacy.md
#: measured at 15 epochs on its 3-seed rows (0.40 and 1.51 pp), so a smaller gain is not one a
#: page of 3 seeds could tell from noise.
THRESHOLD_PP = 1.0
SEED = 0
QUICK_CELLS = CELLS[:1]
QUICK_BUDGETS = (1, 2)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    runs = []
    for label, spec, target in QUICK_CELLS if quick else CELLS:
        for epochs in QUICK_BUDGETS if quick else BUDGETS:
            train = regime.train_config(regime.recipe(quick, epochs), spec, target)
            config = dict(label=label, spec=spec, partition="iid", target=target, train=train)
            runs.append(Run(f"{label}/eps={target:g}/{epochs} epochs", config, SEED, epochs))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """One DP run of the privacy pages' regime at the run's epochs (evaluated every quarter)."""
    start = os.getloadavg()[0]
    out = regime.dp_row(run.config, run.seed)
    return regime.with_load(dict(out, epochs=run.config["train"]["epochs"]), start)


def gains(rows: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, float], List[Tuple[int, int, float]]]:
    """Per (label, target): (epochs, doubled epochs, accuracy gain in pp) for every budget whose
    double also ran; failed runs give no gain."""
    by_cell: Dict[Tuple[str, float], Dict[int, float]] = {}
    for r in rows:
        if "error" not in r:
            by_cell.setdefault((r["label"], r["target"]), {})[r["epochs"]] = r["acc_avg"]
    return {
        cell: [(e, 2 * e, 100 * (accs[2 * e] - accs[e])) for e in sorted(accs) if 2 * e in accs]
        for cell, accs in by_cell.items()
    }


def verdict(
    rows: Sequence[Dict[str, Any]], budgets: Sequence[int], threshold: float = THRESHOLD_PP
) -> Optional[int]:
    """The smallest budget whose doubling gains less than `threshold` pp on every cell (and
    every larger budget's doubling too), or None when no budget of the plan is one."""
    per_cell = gains(rows)
    cells = {(r["label"], r["target"]) for r in rows}
    for e in budgets:
        later = [b for b in budgets if b >= e and 2 * b in budgets]
        if not later:
            return None
        measured = [{a: g for a, _, g in per_cell.get(cell, [])} for cell in cells]
        if all(b in m and m[b] < threshold for m in measured for b in later):
            return e
    return None


def verdicts(
    rows: Sequence[Dict[str, Any]], budgets: Sequence[int], threshold: float = THRESHOLD_PP
) -> Dict[float, Optional[int]]:
    """`verdict` for each target epsilon, on that epsilon's cells alone."""
    targets = sorted({r["target"] for r in rows}, reverse=True)
    return {t: verdict([r for r in rows if r["target"] == t], budgets, threshold) for t in targets}


def render(rows: Rows) -> Outputs:
    data, quick = rows.data, rows.quick
    budgets = QUICK_BUDGETS if quick else BUDGETS
    plan_ = regime.recipe(quick)
    at_once, setting = regime.at_once(rows), regime.setting_words(quick)
    text = (
        "# The DP regime's training budget: does doubling the epochs still pay?\n\n"
        f"{made_by(rows)} Backend local (8 peer threads, one torch thread each), {at_once}on "
        f"{data[0].get('cores', 'n/a')} CPU cores shared with other jobs (1-minute load average "
        f"{regime.loads(data)} at the runs' starts and ends). Setting: {setting}; "
        f"privacy_dp_sweep.md's chosen DP regime (expected batch {plan_['dp_batch']}, lr "
        f"{plan_['dp_lr']}, clip C = {regime.CLIP:g}, δ = {regime.DELTA:g}, SGD momentum 0.9, "
        f"cosine schedule to lr 0 with {plan_['warmup']} warm-up epoch), run by the privacy "
        f"pages' own code (`experiments/pages/_privacy.py`), seed {SEED}. Each run's σ is solved "
        "for its target ε at its own number of steps, so a longer run adds more noise per step "
        "and spends the same ε. Under the cosine schedule every run ends at lr 0, so the flat "
        "last quarter of a run is not a plateau; the test here is the final averaged-model "
        "accuracy against the budget at the same ε. Declared before the runs: a doubling that "
        f"gains less than {THRESHOLD_PP:g} pp no longer pays (below the seed-to-seed standard "
        "deviation of privacy.md's 3-seed rows at 15 epochs, 0.40–1.51 pp). One seed per run: "
        "DP noise is secret per peer (fresh OS entropy), so a rerun lands elsewhere by about "
        "that standard deviation.\n\n## Runs\n\n"
        "| algorithm | target ε | epochs | steps | σ | ε (max over peers) | averaged-model acc | "
        "at ¾ of the run | consensus distance (end) | seconds |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in data:
        text += f"| {r['label']} | {r['target']:g} | {r['epochs']} |"
        if "error" in r:
            text += f" FAILED: {r['error'].replace('|', '/')} | | | | | | |\n"
            continue
        consensus = r.get("consensus")
        text += (
            f" {r['steps']} | {r['sigma']:.3g} | {r['eps_max']:.3g} | "
            f"{regime.pct(r['acc_avg'])} | {regime.pct(r.get('acc_3q'))} | "
            + ("n/a" if consensus is None else f"{consensus:.3g}")
            + f" | {r['run_seconds']:.0f} |\n"
        )
    steps = [e for e in budgets if 2 * e in budgets]
    text += "\n## Gain per doubling\n\n| algorithm | target ε | "
    text += " | ".join(f"{e} → {2 * e}" for e in steps) + " |\n|---|---|" + "---|" * len(steps)
    for (label, target), values in gains(data).items():
        by = {a: g for a, _, g in values}
        cells = " | ".join(f"{by[e]:+.2f} pp" if e in by else "n/a" for e in steps)
        text += f"\n| {label} | {target:g} | {cells} |"
    text += (
        "\n\n## Verdict\n\nFor each target ε, the smallest budget of the plan from which every "
        f"doubling gains less than {THRESHOLD_PP:g} pp on every cell of that ε. privacy.md's and "
        "privacy_attacks.md's DP rows train for it (`_privacy.DP_EPOCHS`). A budget below "
        f"{budgets[0]} epochs is not tried: where the verdict is {budgets[0]}, fewer epochs may "
        "do as well or better.\n\n"
    )
    for target, epochs in verdicts(data, budgets).items():
        cells = ", ".join(sorted({r["label"] for r in data if r["target"] == target}))
        text += f"- ε = {target:g} ({cells}): " + (
            f"**{epochs} epochs**.\n"
            if epochs is not None
            else f"none of {', '.join(map(str, budgets))} epochs: a doubling of the largest "
            "measured budgets still pays, so no budget here is shown to be a plateau.\n"
        )
    missing = [r for r in plan(quick, {}) if r.key not in rows.by_key]
    if missing:
        text += "\n## Not run\n\n" + "\n".join(
            f"- {r.config['label']} at target ε {r.config['target']:g}, "
            f"{r.config['train']['epochs']} epochs"
            for r in missing
        )
        text += "\n"
    return {"privacy_dp_budget.md": text}


PAGE = register(
    Page(
        name="privacy_dp_budget",
        title="the DP regime's training budget: 15/30/60 epochs at ε = 8, 3, 1 (does doubling pay?)",
        plan=plan,
        row=row,
        render=render,
    )
)
