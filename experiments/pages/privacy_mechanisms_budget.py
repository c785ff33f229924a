"""`python -m experiments privacy_mechanisms_budget`: does doubling the logreg mechanisms page's
budget still pay? The rule (declared before the 256-epoch runs): `doublings`, `verdicts`."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._markdown import fill, table, template
from experiments.pages._privacy import plateau_budget

from experiments.pages.privacy_mechanisms import ALGORITHMS, MECHANISMS, setting_of
from experiments.pages.privacy_mechanisms.page import NAMES, WORDS
from experiments.pages.privacy_mechanisms.runs import plan_runs, row

#: Epochs of each run, per topology: the page's 512 and below, and 1024 where 512 still paid.
BUDGETS = dict.fromkeys(("ring:8", "ring:16"), (128, 256, 512))
BUDGETS["exponential:16"] = (128, 256, 512, 1024)
QUICK_BUDGETS = {"ring:4": (4, 8)}
#: A doubling pays when the mean gain exceeds this many times the larger seed std of the two.
CLEAR = 2.0
#: Per (topology, mechanism, algorithm), per budget in epochs, the final accuracies (`cells`).
Table = Dict[Tuple[str, str, str], Dict[int, List[float]]]


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """Each budget's runs (--quick: exact gossip only, under the page's cosine schedule)."""
    runs, algorithms = [], ALGORITHMS[:1] if quick else ALGORITHMS
    for topology, budgets in (QUICK_BUDGETS if quick else BUDGETS).items():
        for epochs in budgets:
            setting = dict(setting_of(topology, quick, epochs), schedule="cosine")
            runs += plan_runs(f"{epochs} epochs/", setting, algorithms, MECHANISMS, rows, False)
    return runs


def _stats(values: Sequence[float]) -> Tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def cells(rows: Sequence[Dict[str, Any]]) -> Table:
    """Per (topology, mechanism, algorithm), per budget in epochs, the final accuracies."""
    out: Table = {}
    for r in rows:
        key = (r["topology"], r["mechanism"], r["algorithm"])
        out.setdefault(key, {}).setdefault(r["epochs"], []).append(r["acc_avg"])
    return out


def doublings(accs: Dict[int, List[float]]) -> List[Dict[str, Any]]:
    """Each doubling run: gain in pp, larger seed std, pays (None: a single seed)."""
    out = []
    for epochs in (e for e in sorted(accs) if 2 * e in accs):
        (a, sa), (b, sb) = _stats(accs[epochs]), _stats(accs[2 * epochs])
        gain, sd = 100 * (b - a), 100 * max(sa, sb)
        judged = min(len(accs[epochs]), len(accs[2 * epochs])) > 1
        pays = gain > CLEAR * sd if judged else None
        out.append(dict(epochs=epochs, gain=gain, sd=sd, pays=pays))
    return out


def verdicts(table: Table) -> Dict[str, Any]:
    """Per topology, the smallest budget from which no private row pays to double."""
    out: Dict[str, Any] = {}
    for topology in dict.fromkeys(k[0] for k in table):
        private = [v for k, v in table.items() if k[0] == topology and k[1] != "none"]
        budgets = sorted({e for accs in private for e in accs})
        steps = [d for accs in private for d in doublings(accs)]
        out[topology] = plateau_budget(
            budgets, lambda b: all(d["pays"] is False for d in steps if d["epochs"] == b)
        )
    return out


def render(rows: Rows) -> Outputs:
    """The page (its fixed text: privacy_mechanisms_budget.md beside this file)."""
    by_row = cells([r.row for r in rows.records if r.config["kind"] == "run"])
    budgets = sorted({e for accs in by_row.values() for e in accs})
    steps = [e for e in budgets if 2 * e in budgets]
    header = ["topology", "mechanism", "algorithm"] + [f"{e} epochs" for e in budgets]
    lines = []
    for (topology, mechanism, algorithm), accs in by_row.items():
        stats = {e: [100 * v for v in _stats(accs[e])] for e in accs}
        cols = [
            f"{stats[e][0]:.2f} ± {stats[e][1]:.2f} %" if e in stats else "n/a" for e in budgets
        ]
        by = {d["epochs"]: d for d in doublings(accs)}
        for d in (by.get(e) for e in steps):
            pays = "" if d is None else {True: " **pays**", None: " (one seed)"}.get(d["pays"], "")
            cols.append("n/a" if d is None else f"{d['gain']:+.2f} pp{pays}")
        lines.append([topology, NAMES[mechanism], algorithm] + cols)
    header += [f"{e} → {2 * e}" for e in steps]
    text = template(__file__, "privacy_mechanisms_budget.md")
    fields = dict(made_by=made_by(rows), clear=CLEAR, table=table(header, lines, end=None))
    fields.update(verdicts=verdict_lines(by_row), largest=budgets[-1], command=rows.command)
    return {"privacy_mechanisms_budget.md": fill(text, **fields)}


def verdict_lines(table) -> List[str]:
    """Per topology, the plateau budget and the private rows whose doubling still pays."""
    lines = []
    for topology, epochs in verdicts(table).items():
        paying = "; ".join(
            WORDS["budget pays"].format(
                NAMES[k[1]], k[2], double=2 * d["epochs"], sd2=CLEAR * d["sd"], **d
            )
            for k, accs in table.items()
            if k[0] == topology and k[1] != "none"
            for d in doublings(accs)
            if d["pays"] is not False
        )
        v = dict(topology=topology, epochs=epochs, paying=paying)
        v["smaller"] = WORDS["budget smaller"].format(paying) if paying else "."
        lines.append(WORDS["budget none" if epochs is None else "budget plateau"].format(**v))
    return lines


TITLE = "the mechanisms page at 128/256/512(/1024) epochs: does doubling the budget still pay?"
PAGE = register(Page("privacy_mechanisms_budget", TITLE, plan, row, render))
