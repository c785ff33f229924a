"""`python -m experiments.privacy_mechanisms_budget --runs DIR DIR [...] [--out DIR]
[--extend] [--render-only]`: does doubling the mechanisms page's training budget still pay?

Each DIR holds a finished `python -m experiments.privacy_mechanisms` run (its
privacy_mechanisms.json and .header.json) of the same plan at another ``--epochs``. At a fixed
epsilon each run's noise is solved for its own number of steps, so a longer run adds more noise
per step and spends the same epsilon; under the cosine schedule every run ends at lr 0, so the
test is the final averaged-model accuracy against the budget.

The rule, declared before the 256-epoch runs were made: a doubling *pays* on a row (topology,
mechanism, algorithm) when its mean final accuracy over the seeds gains more than twice the larger
of the two budgets' seed standard deviations (the page's own "clear effect" rule); a budget is a
plateau for a topology when no private row of it pays to double.

Writes privacy_mechanisms_budget.{md,json} under --out (default runs/privacy-mechanisms-budget);
the JSON keeps every number the page uses, so --render-only draws it again without the runs, and
--extend adds new runs (a larger budget) to those it recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gossip_powersgd.utils import atomic_write, git_commit

from .privacy_mechanisms_page import NAMES

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "runs" / "privacy-mechanisms-budget"
COMMAND = "python -m experiments.privacy_mechanisms_budget"
#: A doubling pays when the mean gain exceeds this many times the larger seed std of the two.
CLEAR = 2.0
_KEEP = ("topology", "mechanism", "algorithm", "seed", "epochs", "steps", "acc_avg", "acc_3q")


def extract(run_dir: Path) -> Dict[str, Any]:
    """What the budget page needs of one run: its command and commit sentence, and per row the
    keys of `_KEEP` (Muffliato rows that reuse local DP-SGD's runs are left out)."""
    path = run_dir / "privacy_mechanisms.json"
    header = run_dir / "privacy_mechanisms.header.json"
    if not path.is_file() or not header.is_file():
        raise SystemExit(
            f"--runs {run_dir}: no finished privacy_mechanisms run there (its .json and "
            ".header.json): run `python -m experiments.privacy_mechanisms --out DIR` first"
        )
    sections = json.loads(path.read_text())
    rows = [
        dict({k: r[k] for k in _KEEP}, epochs=s["setting"]["epochs"])
        for s in sections
        for r in s["rows"]
    ]
    return dict(generated=json.loads(header.read_text())["generated"], rows=rows)


def _stats(values: Sequence[float]) -> Tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def cells(runs: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, str, str], Dict[int, List[float]]]:
    """Per (topology, mechanism, algorithm), per budget in epochs, the final accuracies."""
    out: Dict[Tuple[str, str, str], Dict[int, List[float]]] = {}
    for run in runs:
        for r in run["rows"]:
            key = (r["topology"], r["mechanism"], r["algorithm"])
            out.setdefault(key, {}).setdefault(r["epochs"], []).append(r["acc_avg"])
    return out


def doublings(accs: Dict[int, List[float]]) -> List[Dict[str, Any]]:
    """Every budget whose double was also run: the gain in pp, the larger seed std, and whether
    the doubling pays (gain > CLEAR x that std; None with a single seed at either budget, which
    has no spread to judge by, and which no verdict takes for a plateau)."""
    out = []
    for epochs in sorted(accs):
        if 2 * epochs not in accs:
            continue
        (a, sa), (b, sb) = _stats(accs[epochs]), _stats(accs[2 * epochs])
        gain, sd = 100 * (b - a), 100 * max(sa, sb)
        judged = min(len(accs[epochs]), len(accs[2 * epochs])) > 1
        pays = gain > CLEAR * sd if judged else None
        out.append(dict(epochs=epochs, gain=gain, sd=sd, pays=pays))
    return out


def verdicts(table: Dict[Tuple[str, str, str], Dict[int, List[float]]]) -> Dict[str, Any]:
    """Per topology, the smallest budget from which no private row pays to double (None: every
    budget has a row that still pays, so no plateau is shown)."""
    out: Dict[str, Any] = {}
    for topology in dict.fromkeys(k[0] for k in table):
        private = [v for k, v in table.items() if k[0] == topology and k[1] != "none"]
        budgets = sorted({e for accs in private for e in accs})
        found = None
        for e in budgets:
            later = [b for b in budgets if b >= e and 2 * b in budgets]
            if not later:
                break
            if all(
                step["pays"] is False
                for accs in private
                for step in doublings(accs)
                if step["epochs"] in later
            ):
                found = e
                break
        out[topology] = found
    return out


def page(result: Dict[str, Any], command: str) -> str:
    table = cells(result["runs"])
    best = verdicts(table)
    budgets = sorted({e for accs in table.values() for e in accs})
    steps = [e for e in budgets if 2 * e in budgets]
    made = f"Rendered by `{command}` (commit {git_commit()}) from the runs made by " + "; ".join(
        f"“{run['generated']}”" for run in result["runs"]
    )
    lines = [
        "# The mechanisms page's training budget: does doubling the epochs still pay?",
        "",
        made,
        "",
        "Same plan at each budget (privacy_mechanisms.md's setting: every topology, mechanism, "
        "algorithm and seed), each run's noise solved for ε = 4 against a neighbour at its own "
        "number of steps, so a longer run adds more noise per step and spends the same ε. Under "
        "the cosine schedule every run ends at lr 0: the test is the final averaged-model "
        "accuracy against the budget. Declared before the longer runs were made: a doubling "
        f"pays on a row when its mean gain exceeds {CLEAR:g} × the larger of the two budgets' "
        "seed standard deviations (the page's own rule for a clear effect); a budget is a "
        "plateau for a topology when no private row pays to double it.",
        "",
        "## Final accuracy per budget (mean ± std over the seeds)",
        "",
        "| topology | mechanism | algorithm | "
        + " | ".join(f"{e} epochs" for e in budgets)
        + " | "
        + " | ".join(f"{e} → {2 * e}" for e in steps)
        + " |",
        "|---|---|---|" + "---|" * (len(budgets) + len(steps)),
    ]
    for (topology, mechanism, algorithm), accs in table.items():
        cols = []
        for e in budgets:
            if e in accs:
                mean, sd = _stats(accs[e])
                cols.append(f"{100 * mean:.2f} ± {100 * sd:.2f} %")
            else:
                cols.append("n/a")
        by = {d["epochs"]: d for d in doublings(accs)}
        for e in steps:
            d = by.get(e)
            cols.append(
                "n/a"
                if d is None
                else f"{d['gain']:+.2f} pp"
                + (" **pays**" if d["pays"] else " (one seed)" if d["pays"] is None else "")
            )
        lines.append(
            f"| {topology} | {NAMES[mechanism]} | {algorithm} | " + " | ".join(cols) + " |"
        )
    lines += ["", "## Verdict", ""]
    for topology, epochs in best.items():
        paying = [
            f"{NAMES[k[1]]} {k[2]} {d['epochs']} → {2 * d['epochs']} {d['gain']:+.2f} pp "
            f"(2 × std {CLEAR * d['sd']:.2f})"
            for k, accs in table.items()
            if k[0] == topology and k[1] != "none"
            for d in doublings(accs)
            if d["pays"] is not False
        ]
        if epochs is not None:
            lines.append(
                f"- **{topology}**: **{epochs} epochs**: no private row gains clearly from "
                "doubling it"
                + (f" (rows that pay at a smaller budget: {'; '.join(paying)})." if paying else ".")
            )
        else:
            lines.append(
                f"- **{topology}**: no budget here is shown to be a plateau: doubling the largest "
                "measured budgets still pays, or has one seed to judge by, on "
                f"{'; '.join(paying)}."
            )
    lines += [
        "",
        f"A budget above {budgets[-1]} epochs was not run.",
        "",
        "## Reproduce",
        "",
        "```",
        *(
            run["generated"].split("`")[1]
            for run in result["runs"]
            if run["generated"].count("`") >= 2
        ),
        command,
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument(
        "--runs", type=Path, nargs="+", default=None, help="folders of finished runs"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--extend",
        action="store_true",
        help="keep the runs already recorded in --out's JSON (their numbers as recorded, the "
        "runs' folders no longer needed) and add --runs to them",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="read no run: draw the page again from the JSON in --out",
    )
    args = parser.parse_args(argv)
    out = args.out or DEFAULT_OUT
    saved = out / "privacy_mechanisms_budget.json"
    if args.render_only:
        if not saved.is_file():
            parser.error(f"--render-only: no {saved} (make the page with --runs first)")
        result = json.loads(saved.read_text())
    elif args.extend:
        if not saved.is_file():
            parser.error(f"--extend: no {saved} to extend (make the page with --runs first)")
        if not args.runs:
            parser.error("--extend needs --runs: the folders of the runs to add")
        result = json.loads(saved.read_text())
        known = {run["generated"] for run in result["runs"]}
        for d in args.runs:
            run = extract(d)
            if run["generated"] in known:
                parser.error(f"--extend: the run in {d} is already on the page")
            result["runs"].append(run)
    else:
        if not args.runs or len(args.runs) < 2:
            parser.error("--runs needs two or more folders of runs at different --epochs")
        result = dict(runs=[extract(d) for d in args.runs])
    command = COMMAND + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    out.mkdir(parents=True, exist_ok=True)
    result["verdicts"] = verdicts(cells(result["runs"]))
    atomic_write(saved, json.dumps(result, indent=1) + "\n")
    atomic_write(out / "privacy_mechanisms_budget.md", page(result, command))
    print(f"wrote {out / 'privacy_mechanisms_budget.md'} (verdicts {result['verdicts']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
