"""`python -m experiments privacy_dp_budget`: does the privacy pages' DP regime train to a plateau?
Per ε, the budget from which doubling no longer pays (`verdicts`) is `_privacy.DP_EPOCHS`."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import _privacy as regime
from experiments.pages import register
from experiments.pages._markdown import fill, snippets, table

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
#: A doubling that gains less than this (pp of averaged-model accuracy) no longer pays: declared
#: before the runs, below privacy.md's seed-to-seed sd at 15 epochs (0.40 and 1.51 pp).
THRESHOLD_PP = 1.0
SEED = 0
QUICK_CELLS = CELLS[:1]
QUICK_BUDGETS = (1, 2)
TEXT = snippets(__file__, "privacy_dp_budget.md")


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
    return dict(regime.dp_row(run.config, run.seed), epochs=run.config["train"]["epochs"])


def gains(rows: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, float], List[Tuple[int, int, float]]]:
    """Per (label, target): (epochs, doubled, gain in pp) of each doubling run (failed: none)."""
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
    """The smallest budget from which no doubling gains `threshold` pp on any cell, or None."""
    per_cell = gains(rows)  # a cell whose runs all failed has no gain: never a plateau
    cells = {(r["label"], r["target"]) for r in rows}
    measured = [{a: g for a, _, g in per_cell.get(cell, [])} for cell in cells]
    return regime.plateau_budget(
        budgets, lambda b: all(b in m and m[b] < threshold for m in measured)
    )


def verdicts(
    rows: Sequence[Dict[str, Any]], budgets: Sequence[int], threshold: float = THRESHOLD_PP
) -> Dict[float, Optional[int]]:
    """`verdict` for each target epsilon, on that epsilon's cells alone."""
    targets = sorted({r["target"] for r in rows}, reverse=True)
    return {t: verdict([r for r in rows if r["target"] == t], budgets, threshold) for t in targets}


def _run_line(r: Dict[str, Any]) -> str:
    """The run's line of the runs table (privacy_dp_budget.md's `run`, or `failed`)."""
    consensus = "n/a" if r.get("consensus") is None else f"{r['consensus']:.3g}"
    return regime.run_line(TEXT, dict(r, consensus=consensus)) + "\n"


def render(rows: Rows) -> Outputs:
    """The page (its fixed text: privacy_dp_budget.md beside this file)."""
    data = rows.data
    budgets = QUICK_BUDGETS if rows.quick else BUDGETS
    steps = [e for e in budgets if 2 * e in budgets]
    gain_rows = []
    for (label, target), values in gains(data).items():
        by = {a: g for a, _, g in values}
        cells = [f"{by[e]:+.2f} pp" if e in by else "n/a" for e in steps]
        gain_rows.append([label, f"{target:g}", *cells])
    verdict_lines = []
    for target, epochs in verdicts(data, budgets).items():
        cells = ", ".join(sorted({r["label"] for r in data if r["target"] == target}))
        words = dict(epochs=epochs, budgets=", ".join(map(str, budgets)))
        found = TEXT["none" if epochs is None else "found"].format(**words)
        verdict_lines.append(f"- ε = {target:g} ({cells}): {found}\n")
    missing = [r.config for r in plan(rows.quick, {}) if r.key not in rows.by_key]
    not_run = "".join(
        f"\n- {c['label']} at target ε {c['target']:g}, {c['train']['epochs']} epochs"
        for c in missing
    )
    header = ["algorithm", "target ε"] + [f"{e} → {2 * e}" for e in steps]
    words = dict(regime.page_fields(rows), seed=SEED, threshold=THRESHOLD_PP, first=budgets[0])
    words["runs"] = "".join(map(_run_line, data))
    words["gains"] = "\n".join(table(header, gain_rows, end=None))
    words["verdicts"] = "".join(verdict_lines)
    words["not_run"] = f"\n## Not run\n{not_run}\n" if missing else ""
    return {"privacy_dp_budget.md": fill(TEXT["page"], **words)}


TITLE = "the DP regime's training budget: 15/30/60 epochs at ε = 8, 3, 1 (does doubling pay?)"
PAGE = register(Page("privacy_dp_budget", TITLE, plan, row, render))
