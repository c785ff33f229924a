"""`python -m experiments privacy_dp_subspace`: does keeping the private update in the exchanged
subspace (privacy/subspace.py) rescue PowerGossip under DP? In the privacy pages' DP regime."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._markdown import block, fill, mean_sd, pm, snippets, table_rows
from experiments.pages._markdown import table as table_lines
from experiments.pages._privacy import DELTA, dp_epochs, dp_row, page_fields, recipe, run_line
from experiments.pages._privacy import train_config

_SUBSPACE = dict(dp_exchanged_subspace=True)
_FEEDBACK = dict(dp_exchanged_subspace=True, dp_subspace_feedback=True)
#: (label, algorithm spec, config keys on top of the regime). The first of a rank is the plain
#: algorithm each variant is compared with.
VARIANTS = (
    ("exact gossip", "exact", {}),
    ("PowerGossip r1", "powergossip:rank=1,iters=1", {}),
    ("PowerGossip r1, update in the exchanged subspace", "powergossip:rank=1,iters=1", _SUBSPACE),
    ("PowerGossip r1, exchanged subspace + feedback", "powergossip:rank=1,iters=1", _FEEDBACK),
    ("PowerGossip r4", "powergossip:rank=4,iters=1", {}),
    ("PowerGossip r4, update in the exchanged subspace", "powergossip:rank=4,iters=1", _SUBSPACE),
)
TARGETS = (8.0, 3.0)
SEEDS = (0, 1, 2)
QUICK = (VARIANTS[1:3], (3.0,), (0,))
TEXT = snippets(__file__, "privacy_dp_subspace.md")


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    variants, targets, seeds = QUICK if quick else (VARIANTS, TARGETS, SEEDS)
    runs = []
    for target, (label, spec, extra) in itertools.product(targets, variants):
        train = train_config(recipe(quick), spec, target, extra=extra)
        config = dict(label=label, spec=spec, partition="iid", target=target, extra=extra)
        config["train"] = train
        for seed in seeds:
            key = f"{label}/eps={target:g}/seed{seed}"
            runs.append(Run(key, config, seed, train["epochs"]))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """One DP run of the privacy pages' regime with the variant's keys, at target's budget."""
    return dict(dp_row(run.config, run.seed), extra=run.config["extra"])


def cells(rows: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, float], Dict[str, Any]]:
    """Per (label, target) over seeds: accuracy, consensus geometric means, failed runs."""
    out: Dict[Tuple[str, float], Dict[str, Any]] = {}
    for r in rows:
        key = (r["label"], r["target"])
        cell = out.setdefault(key, dict(acc=[], history={}, failed=0, rows=[]))
        cell["failed"] += "error" in r
        if "error" not in r:
            cell["rows"].append(r)
            cell["acc"].append(r["acc_avg"])
            for epoch, distance in r.get("consensus_history", []):
                cell["history"].setdefault(epoch, []).append(distance)
    for cell in out.values():
        if cell["acc"]:
            cell["acc_mean"], sd = mean_sd(cell["acc"])
            cell["acc_sd"] = math.nan if sd is None else sd
            cell["consensus_gm"] = _geomean([r["consensus"] for r in cell["rows"]])
        cell["history_gm"] = {e: _geomean(v) for e, v in sorted(cell["history"].items())}
    return out


def _geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(v, 1e-300)) for v in values))


def _acc(cell: Dict[str, Any]) -> str:
    if not cell.get("acc"):
        return "n/a"
    sd = None if math.isnan(cell["acc_sd"]) else cell["acc_sd"]
    return pm(cell["acc_mean"], sd, scale=100, unit=" %")


def comparisons(table: Dict[Tuple[str, float], Dict[str, Any]], targets: Sequence[float]):
    """Each variant against its rank's plain algorithm at the same ε, where both finished."""
    for target in targets:
        for label, _, extra in VARIANTS:
            base_label = label.split(",")[0]
            base, cell = table.get((base_label, target)), table.get((label, target))
            if extra and base and cell and base.get("acc") and cell.get("acc"):
                sds = (base["acc_sd"], cell["acc_sd"])
                c = dict(target=target, label=label, base_label=base_label, acc=_acc(cell))
                c.update(base_acc=_acc(base), end=cell["consensus_gm"])
                c.update(diff=100 * (cell["acc_mean"] - base["acc_mean"]), spread=200 * max(sds))
                yield dict(c, one_seed=any(map(math.isnan, sds)), base_end=base["consensus_gm"])


def verdict_text(table: Dict[Tuple[str, float], Dict[str, Any]], targets: Sequence[float]) -> str:
    """`comparisons` in words: a difference counts beyond twice the larger seed sd."""
    lines = []
    for c in comparisons(table, targets):
        diff, spread = c["diff"], c["spread"]
        word = "better than" if diff > spread else "worse than" if diff < -spread else None
        judged = TEXT["judged"].format(word=word or "not distinguishable from", spread=spread)
        judged = TEXT["one_seed"] if c["one_seed"] else judged
        lines.append(TEXT["verdict"].format(**c, judged=judged))
    return "\n".join(lines) + "\n"


def conclusion(table: Dict[Tuple[str, float], Dict[str, Any]], targets: Sequence[float]) -> str:
    """The answer: does the projection lower the drift, does it pay, how far rank 4 is."""

    def got(variant: int, target: float, key: str) -> Optional[float]:
        cell = table.get((VARIANTS[variant][0], target))
        return cell[key] if cell and cell.get("acc") else None

    changes = [(c["diff"], c["spread"]) for c in comparisons(table, targets)]
    drops, gaps = [], []
    for t in targets:
        plain, projected = got(1, t, "consensus_gm"), got(2, t, "consensus_gm")
        if plain is not None and projected is not None:
            drops.append(f"{plain:.3g} → {projected:.3g} at ε = {t:g}")
        r4, exact = got(4, t, "acc_mean"), got(0, t, "acc_mean")
        if r4 is not None and exact is not None:
            gaps.append(f"{100 * (exact - r4):+.2f} pp at ε = {t:g}")
    if not drops or not changes:
        return ""
    diffs = [d for d, _ in changes]
    worse = all(d < -spread for d, spread in changes)  # False with one seed (nan spread)
    parts = [TEXT["drift"].format(drops="; ".join(drops))]
    parts.append(TEXT["worse" if worse else "range"].format(low=min(diffs), high=max(diffs)))
    parts += [TEXT["rank"].format(gaps="; ".join(gaps))] if gaps else []
    return " ".join(parts) + "\n"


def _message_dp(rows: Sequence[Dict[str, Any]], targets: Sequence[float]) -> str:
    """What DP on the messages would cost: one Gaussian release per step, q = 1, norm B."""
    from gossip_powersgd.privacy.accounting import noise_for_target

    parts = []
    for target in targets:
        steps = sorted({int(r["steps"]) for r in rows if r["target"] == target})
        if len(steps) == 1:
            z = noise_for_target(target, DELTA, [1.0], steps[0])
            parts.append(TEXT["message_dp"].format(target=target, steps=steps[0], std=2 * z))
    return "; ".join(parts) + " (RDP, q = 1)" if parts else "not computed (no finished row)"


def render(rows: Rows) -> Outputs:
    """The page; its fixed text is privacy_dp_subspace.md beside this file."""
    quick, data = rows.quick, rows.data
    variants, targets, seeds = QUICK if quick else (VARIANTS, TARGETS, SEEDS)
    budget = recipe(quick)["dp_epochs"]
    table = cells(data)
    missing = [run for run in plan(quick, {}) if run.key not in rows.by_key]
    not_run = [
        f"- {r.config['label']} at target ε {r.config['target']:g}, seed {r.seed}" for r in missing
    ]
    words = dict(page_fields(rows), seeds=", ".join(map(str, seeds)))
    words["budgets"] = ", ".join(f"ε = {t:g}: {budget or dp_epochs(t)} epochs" for t in targets)
    words.update(message_dp=_message_dp(data, targets), runs=[run_line(TEXT, r) for r in data])
    words["accuracy"] = accuracy_table(table, variants, targets)
    words["consensus"] = consensus_tables(table, variants, targets)
    words["verdict"] = block(verdict_text(table, targets))
    words["conclusion"] = block(conclusion(table, targets))
    words["missing"] = ["", "## Not run", "", *not_run] if missing else []
    return {"privacy_dp_subspace.md": fill(TEXT["page"] + "\n", **words)}


def accuracy_table(table, variants, targets) -> List[str]:
    """Per target and variant: σ, ε, accuracy and consensus, mean over seeds."""
    rows = []
    for target, (label, _, _) in itertools.product(targets, variants):
        cell = table.get((label, target))
        if cell is None:
            continue
        done = cell["rows"]
        sigma = ", ".join(sorted({f"{r['sigma']:.3g}" for r in done})) or "n/a"
        eps = max((r["eps_max"] for r in done), default=math.nan)
        mb = statistics.fmean(r["mb_per_peer"] for r in done) if done else math.nan
        consensus = f"{cell['consensus_gm']:.3g}" if done else "n/a"
        rows.append([f"{target:g}", label, sigma, f"{eps:.3g}", _acc(cell), consensus])
        rows[-1] += [f"{mb:.3g}", str(cell["failed"])]
    return table_rows(rows)


def consensus_tables(table, variants, targets) -> List[str]:
    """Per target, the geometric mean over seeds of the consensus distance at each evaluation."""
    lines = []
    for target in targets:
        epochs = sorted({e for (_, t), c in table.items() if t == target for e in c["history_gm"]})
        found = [
            table[(v[0], target)] | {"label": v[0]} for v in variants if (v[0], target) in table
        ]
        rows = [
            [c["label"]]
            + [f"{c['history_gm'][e]:.3g}" if e in c["history_gm"] else "n/a" for e in epochs]
            for c in found
        ]
        if epochs:
            header = ["variant"] + [f"epoch {e:g}" for e in epochs]
            lines += [f"ε = {target:g}:", ""] + table_lines(header, rows)
    return lines


TITLE = "PowerGossip under DP: the private update kept in the exchanged subspace"
PAGE = register(Page("privacy_dp_subspace", TITLE, plan, row, render))
