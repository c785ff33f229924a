"""paper_standin.md and its plot from the page's measurements (each seed's run as the dict its
JSON holds: setting, traffic, timing, rows, ...); every number on the page comes from them."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional

from experiments.pages._markdown import fill, mean_sd, snippets, table, template, text_table

#: The paper's run: 8 peers (the template says 8 and CIFAR-10's 50,000 training images).
PAPER_PEERS = 8
#: The page's parts shown where its rows call for them, and the findings' sentences.
PARTS = snippets(__file__, "parts.md")


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _row(rows: List[Dict[str, Any]], label: str) -> Optional[Dict[str, Any]]:
    return next((r for r in rows if r["label"] == label), None)


def accuracy_at(row: Dict[str, Any], budget_mb: float) -> Optional[Dict[str, Any]]:
    """The row's last evaluation made before it had sent more than `budget_mb` per peer."""
    within = [e for e in row["evals"] if e["mb"] <= budget_mb * (1 + 1e-9)]
    return within[-1] if within else None


def _budgets(rows: List[Dict[str, Any]]) -> List[tuple]:
    """Equal-bytes budgets: the final traffic of each communicating row, smallest first."""
    out: Dict[float, tuple] = {}
    for r in sorted(_gossip(rows), key=lambda r: r["mb_per_peer"]):
        if r["mb_per_peer"] > 0:
            out.setdefault(round(r["mb_per_peer"], 6), (r["label"], r["mb_per_peer"]))
    return list(out.values())


def _gossip(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows that gossip (all-reduce's bytes are not a gossip exchange's)."""
    return [r for r in rows if r["algorithm"] != "allreduce"]


def page(result: Dict[str, Any], generated: str, others: List[Dict[str, Any]] = ()) -> str:
    """The page: `result` the main run (seed 0, with a row), `generated` the sentence that names
    how it was made, `others` the runs of other seeds (their rows listed beside the main run's)."""
    s, rows = result["setting"], result["rows"]
    timing = result["timing_batch128"]
    proj = result["projection"]
    steps = rows[0]["steps"]
    peers = int(s["topology"].split(":")[1])
    n = int(s["dataset"].split("n=")[1].split(",")[0])
    failed = []
    for f in result.get("failed", []):
        failed += [f"**Row {f['label']} (`{f['algorithm']}`) failed:** {f['error']}", ""]
    epochs = [e["epoch"] for e in rows[0]["evals"]]
    body = _other_seeds(result, others)
    body += _findings(rows, int(s["dataset"].split("test=")[1].split(",")[0]), peers)
    peer_hours = proj["steps"] * timing["cpu_s"] / 3600
    fields = dict(s, **timing, generated=generated, cpu_count=result["cpu_count"], proj=proj)
    fields.update(load=result["load"], parameters=rows[0]["parameters"], per_peer=n // peers)
    fields.update(images=n, steps=steps, minutes=result["seconds"] / 60, rows=len(rows))
    ring_step_cpu = peers * timing["cpu_s"] * s["batch_size"] / timing["batch"]
    fields.update(peers=peers, ring_step_cpu=ring_step_cpu, peer_hours=peer_hours)
    fields.update(row_hours=PAPER_PEERS * peer_hours)
    fields.update(days=len(rows) * proj["steps"] * timing["cpu_s"] / 86400)
    fields.update(cpu_per_step=sum(r["run_cpu_s"] for r in rows) / sum(r["steps"] for r in rows))
    return fill(
        template(__file__),
        **fields,
        traffic=[PARTS["traffic row"].format(**t) for t in result["traffic"]],
        row_lines=[PARTS["row"].format(**r, **_pcts(r)) for r in rows],
        failed=failed + _equal_bytes(rows),
        epochs_list=", ".join(map(str, epochs)),
        curves=_curves(rows, epochs),
        body=body,
    )


def _pcts(row: Dict[str, Any]) -> Dict[str, str]:
    """The row's averaged-model and mean local accuracies as the tables write them."""
    return dict(acc=_pct(row["acc_avg"]), local=_pct(row["acc_local_mean"]))


def _equal_bytes(rows: List[Dict[str, Any]]) -> List[str]:
    """The equal-bytes section: each gossiping row's accuracy within each budget (`_budgets`)."""
    budgets = _budgets(rows)
    if not budgets:
        return []
    head = ["row", *(f"≤ {mb:.2f} MB ({label})" for label, mb in budgets)]
    cells = [
        [r["label"], *(_reached(accuracy_at(r, mb)) for _, mb in budgets)] for r in _gossip(rows)
    ]
    return [PARTS["equal bytes section"], "", text_table(head, cells, "l" + "r" * len(budgets))]


def _reached(record: Optional[Dict[str, Any]]) -> str:
    return "—" if record is None else f"{_pct(record['acc_avg'])} (ep {record['epoch']})"


def _curves(rows: List[Dict[str, Any]], epochs: List[int]) -> List[str]:
    cells = (
        [r["label"]]
        + [
            f"{100 * e['acc_avg']:.1f} / {100 * e['acc_local_mean']:.1f} / "
            f"{e['consensus_distance']:.2g}"
            for e in r["evals"]
        ]
        for r in rows
    )
    return table(["row", *(f"epoch {e}" for e in epochs)], cells, None)


def _other_seeds(result: Dict[str, Any], others: List[Dict[str, Any]]) -> List[str]:
    """The rows of other runs (other seeds) next to the main run's same rows."""
    if not others:
        return []
    lines = [PARTS["other seeds"], ""]
    for other in others:
        where = f" (its JSON: `{other['path']}`)" if other.get("path") else ""
        lines += [f"- {other['generated']}{where}", ""]
    runs = (result, *others)
    labels = dict.fromkeys(r["label"] for o in others for r in o["rows"])
    lines.append(PARTS["seeds table"])
    for label in labels:
        lines += [
            PARTS["seed row"].format(**r, **_pcts(r), seed=seed)
            for seed, r in _by_seed(runs, label)
        ]
    lines.append("")
    for label in labels:
        accs = [r["acc_avg"] for _, r in _by_seed(runs, label)]
        if len(accs) > 1:
            mean, sd = mean_sd(accs)
            cells = dict(label=label, count=len(accs), mean=_pct(mean), sd=100 * sd)
            lines.append(PARTS["seed mean"].format(**cells))
    for first, second in (
        ("exact gossip", "PowerGossip r1"),
        ("PowerGossip r1, 2 iterations", "exact gossip"),
    ):
        seconds = dict(_by_seed(runs, second))
        gaps = [
            (seed, 100 * (a["acc_avg"] - seconds[seed]["acc_avg"]))
            for seed, a in _by_seed(runs, first)
            if seed in seconds
        ]
        if len(gaps) > 1:
            mean = statistics.fmean(g for _, g in gaps)
            text = ", ".join(f"seed {seed}: {gap:+.1f} pp" for seed, gap in gaps)
            cells = dict(first=first, second=second, gaps=text, mean=mean)
            lines.append(PARTS["seed gaps"].format(**cells))
    return lines + [""]


def _by_seed(runs, label: str) -> List[tuple]:
    """(seed, row) of each run in `runs` that has a row `label`."""
    found = ((run["setting"].get("seed", 0), _row(run["rows"], label)) for run in runs)
    return [(seed, r) for seed, r in found if r]


def _standard_error(p: float, n: int) -> float:
    """The binomial standard error of an accuracy p measured on n test images."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def _fields(row: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """What the findings' sentences say of a row, each name prefixed with `prefix`."""
    fields = dict(_pcts(row), label=row["label"], steps=row["steps"], mb=row["mb_per_peer"])
    fields.update(rounds=row["rounds"], loss=row["evals"][-1]["train_loss"])
    fields["distances"] = ", ".join(f"{e['consensus_distance']:.3g}" for e in row["evals"])
    return {prefix + k: v for k, v in fields.items()}


def _findings(rows: List[Dict[str, Any]], n_test: int, peers: int) -> List[str]:
    """Sentences computed from the rows (no number typed by hand), their text in parts.md."""
    ranked = sorted(rows, key=lambda r: -r["acc_avg"])
    se = 100 * _standard_error(0.75, n_test)
    ranking = " > ".join(f"{r['label']} ({_pct(r['acc_avg'])})" for r in ranked)
    ranking = PARTS["ranking"].format(ranking=ranking, n_test=n_test, se=se, se2=2 * se)
    lines = ["## Findings", "", ranking]
    allreduce, exact = _row(rows, "all-reduce"), _row(rows, "exact gossip")
    if allreduce and exact:
        both = {**_fields(allreduce), **_fields(exact, "exact_")}
        lines.append(PARTS["allreduce"].format(**both, peers=peers))
        stale = [
            e
            for e in allreduce["evals"]
            if e["acc_avg"] - e["acc_local_mean"] > 2 * _standard_error(e["acc_avg"], n_test)
        ]
        if stale:
            e = stale[0]
            local, averaged = _pct(e["acc_local_mean"]), _pct(e["acc_avg"])
            lines.append(PARTS["stale"].format(epoch=e["epoch"], local=local, averaged=averaged))
    lines += _compression(rows, n_test) + _equal_budget_and_local_steps(rows)
    return lines + [""]


def _compression(rows: List[Dict[str, Any]], n_test: int) -> List[str]:
    """The findings on PowerGossip's compression: r1 against exact gossip, more iterations, rank 2."""
    lines, exact, r1 = [], _row(rows, "exact gossip"), _row(rows, "PowerGossip r1")
    r2, two = _row(rows, "PowerGossip r2"), _row(rows, "PowerGossip r1, 2 iterations")
    if exact and r1:
        slow = (
            r1["evals"][-1]["consensus_distance"] < r1["evals"][0]["consensus_distance"]
            and r1["consensus_distance"] > 100 * exact["consensus_distance"]
        )
        both = {**_fields(r1), **_fields(exact, "exact_"), "slow": PARTS["slow"] if slow else ""}
        gap, fewer = exact["acc_avg"] - r1["acc_avg"], exact["mb_per_peer"] / r1["mb_per_peer"]
        lines.append(PARTS["r1"].format(**both, gap=100 * gap, fewer=fewer))
    for other, what in ((two, "2 power iterations"), (r2, "rank 2")):
        if other and r1 and exact:
            bytes_ = other["mb_per_peer"] / r1["mb_per_peer"]
            three = {**_fields(other), **_fields(r1, "r1_"), **_fields(exact, "exact_")}
            lines.append(PARTS["more"].format(**three, what=what, bytes=bytes_))
    if exact and r1 and (two or r2):
        r1_error = 2 * _standard_error(r1["acc_avg"], n_test)
        better = [
            o
            for o in (two, r2)
            if o
            and o["consensus_distance"] < r1["consensus_distance"]
            and o["acc_avg"] - r1["acc_avg"] > r1_error
        ]
        labels = " and ".join(o["label"] for o in better)
        lines.append(PARTS["better"].format(labels=labels) if better else PARTS["not better"])
    if (
        two
        and exact
        and two["acc_avg"] - exact["acc_avg"] > 2 * _standard_error(exact["acc_avg"], n_test)
        and two["consensus_distance"] > exact["consensus_distance"]
    ):
        lines.append(
            PARTS["above exact"].format(two=_pct(two["acc_avg"]), exact=_pct(exact["acc_avg"]))
        )
    return lines


def _equal_budget_and_local_steps(rows: List[Dict[str, Any]]) -> List[str]:
    """The findings at the smallest equal-bytes budget and on local steps."""
    lines, h1, budgets = [], _row(rows, "exact gossip"), _budgets(rows)
    if budgets:
        label, mb = budgets[0]
        within = [(r, accuracy_at(r, mb)) for r in _gossip(rows)]
        reached = sorted(((r, e) for r, e in within if e), key=lambda x: -x[1]["acc_avg"])
        reached = ", ".join(
            f"{r['label']} {_pct(e['acc_avg'])} (epoch {e['epoch']})" for r, e in reached
        )
        missing = ", ".join(r["label"] for r, e in within if e is None)
        missing = f"; {missing} had not reached an evaluation within that budget" if missing else ""
        lines.append(
            PARTS["equal bytes finding"].format(
                label=label, mb=mb, reached=reached, missing=missing
            )
        )
    for label in ("exact gossip H=4", "exact gossip H=16"):  # H=1 is exact gossip
        r = _row(rows, label)
        if r and h1:
            lines.append(PARTS["local steps"].format(**_fields(r), **_fields(h1, "h1_")))
    return lines
