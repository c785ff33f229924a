"""`python -m experiments.privacy_attacks.dp_budget [--quick] [--jobs N] [--out DIR]
[--render-only]`: does the DP regime of the privacy pages train to a plateau?

Under a cosine schedule the learning rate reaches 0 at the end of every run, so a flat last
quarter says nothing: the test is the final accuracy against the training budget at the same
target epsilon. This page runs privacy_dp_sweep.md's chosen regime (imported, through the privacy
suite's own `_attempt`) at 15, 30 and 60 epochs for exact gossip at target epsilon 8, 3 and 1
and PowerGossip r1 and r4 at epsilon 8, and names, for each epsilon, the smallest budget after
which doubling gains less than THRESHOLD_PP on every cell of that epsilon: the budget of the
privacy pages' DP rows at that epsilon (dp_sweep.DP_EPOCHS, which a test holds equal to the
committed page's verdicts). At a fixed epsilon a longer run adds more noise per step, so the
best budget falls with epsilon.

Writes privacy_dp_budget.{md,json} under --out (default runs/dp-budget).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gossip_powersgd.utils import atomic_write, git_commit

from .dp_sweep import _load, _pct
from .resumable import Progress, run_missing

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "runs" / "dp-budget"
#: (label, algorithm spec, target epsilon): exact gossip at the headline epsilon and at 3 (more
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
QUICK_CELLS = CELLS[:2]
QUICK_BUDGETS = (1, 2)


def _log(text: str) -> None:
    print(f"[dp-budget {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _key(label: str, target: float, epochs: int) -> str:
    return f"{label} | {target:g} | {epochs}"


def run_cell(label: str, spec: str, target: float, epochs: int, quick: bool) -> Dict[str, Any]:
    """One DP run of the privacy suite's regime at `epochs` (evaluated at every quarter)."""
    from experiments.suite.privacy import _attempt, privacy_plan

    load = os.getloadavg()[0]
    row = _attempt(label, spec, "iid", target, SEED, privacy_plan(quick, epochs=epochs))
    row.update(epochs=epochs, load=[load, os.getloadavg()[0]], commit=git_commit())
    return row


def measure(
    quick: bool,
    jobs: int,
    saved: Optional[Dict[str, Dict[str, Any]]] = None,
    save=None,
    render_only: bool = False,
) -> Tuple[List[Dict[str, Any]], List[Tuple[str, float, int]]]:
    """Every (cell, budget) of the plan, `jobs` runs at a time (processes); rows in `saved`
    (keyed by `_key`, from an interrupted run) are kept and not run again. Returns the rows in
    the plan's order and the (label, target, epochs) not run (`render_only`)."""
    cells = QUICK_CELLS if quick else CELLS
    budgets = QUICK_BUDGETS if quick else BUDGETS
    done = dict(saved or {})
    todo = [
        (_key(label, target, epochs), (label, spec, target, epochs, quick))
        for label, spec, target in cells
        for epochs in budgets
        if _key(label, target, epochs) not in done
    ]
    if not render_only:
        run_missing(todo, run_cell, jobs, done, save)
    rows, missing = [], []
    for label, _, target in cells:
        for epochs in budgets:
            row = done.get(_key(label, target, epochs))
            if row is None:
                missing.append((label, target, epochs))
            else:
                rows.append(row)
    return rows, missing


def gains(rows: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, float], List[Tuple[int, int, float]]]:
    """Per (label, target): (epochs, doubled epochs, accuracy gain in pp) for every budget whose
    double also ran; failed runs give no gain."""
    by_cell: Dict[Tuple[str, float], Dict[int, float]] = {}
    for r in rows:
        if "error" in r:
            continue
        by_cell.setdefault((r["label"], r["target"]), {})[r["epochs"]] = r["acc_avg"]
    out = {}
    for cell, accs in by_cell.items():
        out[cell] = [
            (e, 2 * e, 100 * (accs[2 * e] - accs[e])) for e in sorted(accs) if 2 * e in accs
        ]
    return out


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
        ok = True
        for cell in cells:
            measured = {a: g for a, _, g in per_cell.get(cell, [])}
            if any(b not in measured or measured[b] >= threshold for b in later):
                ok = False
                break
        if ok:
            return e
    return None


def verdicts(
    rows: Sequence[Dict[str, Any]], budgets: Sequence[int], threshold: float = THRESHOLD_PP
) -> Dict[float, Optional[int]]:
    """`verdict` for each target epsilon, on that epsilon's cells alone."""
    targets = sorted({r["target"] for r in rows}, reverse=True)
    return {t: verdict([r for r in rows if r["target"] == t], budgets, threshold) for t in targets}


def page(
    rows: Sequence[Dict[str, Any]],
    missing: Sequence[Tuple[str, float, int]],
    command: str,
    seconds: float,
    quick: bool,
    jobs: int,
) -> str:
    from experiments.suite.privacy import CLIP, DELTA, privacy_plan

    from .dp_sweep import BASE, PER_PEER

    budgets = QUICK_BUDGETS if quick else BUDGETS
    plan = privacy_plan(quick)
    best = verdicts(rows, budgets)
    commits = sorted({str(r["commit"]) for r in rows if r.get("commit")})
    unstamped = sum(1 for r in rows if not r.get("commit"))
    made = (
        f"Rows made by `python -m experiments.privacy_attacks.dp_budget` ({seconds:.0f} s of "
        f"runs), page rendered by `{command}` (commit {git_commit()})"
        if "--render-only" in command
        else f"Generated by `{command}` in {seconds:.0f} s (commit {git_commit()})"
    )
    if unstamped or len(commits) > 1 or (commits and commits[0] != git_commit()):
        made += (
            f"; the rows resume earlier runs of this command: rows made at commit "
            f"{', '.join(commits) or 'n/a'}"
            + (
                f", and {unstamped} made by a run before rows recorded their commit (the runs' "
                "code, experiments.suite.privacy's `_attempt`, took the same arguments)"
                if unstamped
                else ""
            )
        )
    setting = (
        "the privacy suite's --quick problem"
        if quick
        else f"`{BASE['dataset']}` ({PER_PEER} training samples per peer), `{BASE['model']}`, "
        f"{BASE['topology']}, {BASE['partition']}"
    )
    text = (
        "# The DP regime's training budget: does doubling the epochs still pay?\n\n"
        f"{made}; backend local (8 peer threads, one torch thread each), {jobs} run(s) at once "
        f"on {os.cpu_count()} CPU cores shared with other jobs (1-minute load average "
        f"{_load(rows)} at the runs' starts and ends). Setting: {setting}; privacy_dp_sweep.md's "
        f"chosen DP regime (expected batch {plan['dp_batch']}, lr {plan['dp_lr']}, clip "
        f"C = {CLIP:g}, δ = {DELTA:g}, SGD momentum 0.9, cosine schedule to lr 0 with "
        f"{plan['warmup']} warm-up epoch), run by the privacy suite's own code "
        "(`experiments.suite.privacy`), seed "
        f"{SEED}. Each run's σ is solved for its target ε at its own number of steps, so a "
        "longer run adds more noise per step and spends the same ε. Under the cosine schedule "
        "every run ends at lr 0, so the flat last quarter of a run is not a plateau; the test "
        "here is the final averaged-model accuracy against the budget at the same ε. Declared "
        f"before the runs: a doubling that gains less than {THRESHOLD_PP:g} pp no longer pays "
        "(below the seed-to-seed standard deviation of privacy.md's 3-seed rows at 15 epochs, "
        "0.40–1.51 pp). One seed per run: DP noise is secret per peer (fresh OS entropy), so a "
        "rerun lands elsewhere by about that standard deviation.\n\n"
        "## Runs\n\n"
        "| algorithm | target ε | epochs | steps | σ | ε (max over peers) | averaged-model acc | "
        "at ¾ of the run | consensus distance (end) | seconds |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        head = f"| {r['label']} | {r['target']:g} | {r['epochs']} |"
        if "error" in r:
            text += head + f" FAILED: {r['error'].replace('|', '/')} | | | | | | |\n"
            continue
        consensus = r.get("consensus")
        text += (
            head + f" {r['steps']} | {r['sigma']:.3g} | {r['eps_max']:.3g} | "
            f"{_pct(r['acc_avg'])} | {_pct(r.get('acc_3q'))} | "
            + ("n/a" if consensus is None else f"{consensus:.3g}")
            + f" | {r['run_seconds']:.0f} |\n"
        )
    text += "\n## Gain per doubling\n\n| algorithm | target ε | " + " | ".join(
        f"{e} → {2 * e}" for e in budgets if 2 * e in budgets
    )
    text += " |\n|---|---|" + "---|" * sum(1 for e in budgets if 2 * e in budgets) + "\n"
    per_cell = gains(rows)
    for (label, target), values in per_cell.items():
        by = {a: g for a, _, g in values}
        text += (
            f"| {label} | {target:g} | "
            + " | ".join(
                f"{by[e]:+.2f} pp" if e in by else "n/a" for e in budgets if 2 * e in budgets
            )
            + " |\n"
        )
    text += (
        "\n## Verdict\n\nFor each target ε, the smallest budget of the plan from which every "
        f"doubling gains less than {THRESHOLD_PP:g} pp on every cell of that ε. privacy.md's and "
        "privacy_attacks.md's DP rows train for it (`dp_sweep.DP_EPOCHS`). A budget below "
        f"{budgets[0]} epochs is not tried: where the verdict is {budgets[0]}, fewer epochs may "
        "do as well or better.\n\n"
    )
    for target, epochs in best.items():
        cells = ", ".join(sorted({r["label"] for r in rows if r["target"] == target}))
        text += f"- ε = {target:g} ({cells}): " + (
            f"**{epochs} epochs**.\n"
            if epochs is not None
            else f"none of {', '.join(map(str, budgets))} epochs: a doubling of the largest "
            "measured budgets still pays, so no budget here is shown to be a plateau.\n"
        )
    if missing:
        text += "\n## Not run\n\n" + "\n".join(
            f"- {label} at target ε {target:g}, {epochs} epochs"
            for label, target, epochs in missing
        )
        text += "\n"
    return text


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.privacy_attacks.dp_budget")
    parser.add_argument("--quick", action="store_true", help="tiny problem, seconds")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (processes)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--render-only", action="store_true", help="run nothing: write the page from the JSON"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more runs at once")
    out = args.out or (ROOT / "runs" / "dp-budget-quick" if args.quick else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m experiments.privacy_attacks.dp_budget" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    # a finished page's rows are kept too: a plan that grew runs only its new cells
    progress = Progress(out, "privacy_dp_budget", args.jobs)
    rows, missing = measure(args.quick, args.jobs, progress.rows, progress.save, args.render_only)
    seconds = progress.seconds(ran=not args.render_only)
    budgets = QUICK_BUDGETS if args.quick else BUDGETS
    result = dict(
        rows={_key(r["label"], r["target"], r["epochs"]): r for r in rows},
        budgets=list(budgets),
        threshold_pp=THRESHOLD_PP,
        verdicts={f"{t:g}": e for t, e in verdicts(rows, budgets).items()},
        seconds=seconds,
    )
    atomic_write(
        out / "privacy_dp_budget.md", page(rows, missing, command, seconds, args.quick, args.jobs)
    )
    atomic_write(progress.final, json.dumps(result, indent=1) + "\n")
    progress.finish(complete=not missing)
    _log(f"wrote {out / 'privacy_dp_budget.md'} (verdicts: {result['verdicts']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
