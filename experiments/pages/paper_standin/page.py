"""paper_standin.md and its plot from the page's measurements (each seed's run as the dict its
JSON holds: setting, traffic, timing, rows, ...); every number on the page comes from them."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional

from experiments.pages._markdown import fill, snippets, table, template


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
    seen, out = set(), []
    for r in sorted(rows, key=lambda r: r["mb_per_peer"]):
        if r["algorithm"] == "allreduce":
            continue
        key = round(r["mb_per_peer"], 6)
        if r["mb_per_peer"] > 0 and key not in seen:
            seen.add(key)
            out.append((r["label"], r["mb_per_peer"]))
    return out


def page(result: Dict[str, Any], generated: str, others: List[Dict[str, Any]] = ()) -> str:
    """The page: `result` the main run (seed 0), `generated` the sentence that names how it was
    made, `others` the runs of other seeds (their rows listed beside the main run's)."""
    s, rows = result["setting"], result["rows"]
    timing, proj = result["timing_batch128"], result["projection"]
    peers = int(s["topology"].split(":")[1])
    n = int(s["dataset"].split("n=")[1].split(",")[0])
    steps = rows[0]["steps"] if rows else 0
    failed = []
    for f in result.get("failed", []):
        failed += [f"**Row {f['label']} (`{f['algorithm']}`) failed:** {f['error']}", ""]
    epochs = [e["epoch"] for e in rows[0]["evals"]] if rows else []
    body = _other_seeds(result, others)
    body += _findings(rows, int(s["dataset"].split("test=")[1].split(",")[0]), peers)
    peer_hours = proj["steps"] * timing["cpu_s"] / 3600
    return fill(
        template(__file__),
        **s,
        generated=generated,
        cpu_count=result["cpu_count"],
        load_start=result["load"][0],
        load_end=result["load"][1],
        parameters=rows[0]["parameters"],
        per_peer=n // peers,
        images=n,
        steps=steps,
        minutes=result["seconds"] / 60,
        rows=len(rows),
        peers=peers,
        ring_step_cpu=peers * timing["cpu_s"] * s["batch_size"] / timing["batch"],
        batch=timing["batch"],
        paper_epochs=proj["epochs"],
        cpu_s=timing["cpu_s"],
        wall_s=timing["wall_s"],
        paper_steps=proj["steps"],
        peer_hours=peer_hours,
        row_hours=PAPER_PEERS * peer_hours,
        days=len(rows) * proj["steps"] * timing["cpu_s"] / 86400,
        cpu_per_step=_cpu_per_step(rows),
        traffic=_traffic(result["traffic"]),
        row_lines=_table(rows),
        failed=failed + _equal_bytes(rows),
        epochs_list=", ".join(map(str, epochs)),
        curves=_curves(rows, epochs),
        body=body,
    )


#: The paper's run: 8 peers (the template says 8 and CIFAR-10's 50,000 training images).
PAPER_PEERS = 8


def _traffic(traffic: List[Dict[str, Any]]) -> List[str]:
    return [
        f"| {t['model']} | {t['parameters']:,} | {t['exact_floats']:,.0f} | "
        f"{t['powergossip_r1_floats']:,.1f} | **{t['ratio']:.2f}x** | "
        f"{t['closed_text']} = {t['closed_ratio']:.2f}x |"
        for t in traffic
    ]


def _table(rows: List[Dict[str, Any]]) -> List[str]:
    return [
        f"| {r['label']} | `{r['algorithm']}` | {r['local_steps']} | "
        f"{_pct(r['acc_avg'])} | {_pct(r['acc_local_mean'])} | "
        f"{r['consensus_distance']:.3g} | {r['mb_per_peer']:.2f} | "
        f"{r['compute_s_per_step']:.3f} | {r['gossip_compute_s_per_step']:.4f} | "
        f"{r['run_wall_s']:.0f} | {r['run_cpu_s']:.0f} |"
        for r in rows
    ]


def _equal_bytes(rows: List[Dict[str, Any]]) -> List[str]:
    budgets = _budgets(rows)
    if not budgets:
        return []
    lines = [
        *PARTS["equal bytes section"].split("\n"),
        "",
        "| row | " + " | ".join(f"≤ {mb:.2f} MB ({label})" for label, mb in budgets) + " |",
        "|---|" + "---:|" * len(budgets),
    ]
    for r in rows:
        if r["algorithm"] == "allreduce":
            continue
        cells = []
        for _, mb in budgets:
            e = accuracy_at(r, mb)
            cells.append("—" if e is None else f"{_pct(e['acc_avg'])} (ep {e['epoch']})")
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return lines + [""]


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


def _cpu_per_step(rows: List[Dict[str, Any]]) -> float:
    return sum(r["run_cpu_s"] for r in rows) / max(1, sum(r["steps"] for r in rows))


def _other_seeds(result: Dict[str, Any], others: List[Dict[str, Any]]) -> List[str]:
    """The rows of other runs (other seeds) next to the main run's same rows."""
    if not others:
        return []
    lines = [*PARTS["other seeds"].split("\n"), ""]
    for other in others:
        where = f" (its JSON: `{other['path']}`)" if other.get("path") else ""
        lines += [f"- {other['generated']}{where}", ""]
    lines += [
        "| row | seed | averaged model | mean local | consensus distance | MB sent per peer |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    labels = [r["label"] for o in others for r in o["rows"]]
    for label in dict.fromkeys(labels):
        for run in (result, *others):
            r = _row(run["rows"], label)
            if r:
                lines.append(
                    f"| {label} | {run['setting'].get('seed', 0)} | {_pct(r['acc_avg'])} | "
                    f"{_pct(r['acc_local_mean'])} | {r['consensus_distance']:.3g} | "
                    f"{r['mb_per_peer']:.2f} |"
                )
    lines.append("")
    runs = (result, *others)
    for label in dict.fromkeys(labels):
        accs = [r["acc_avg"] for r in (_row(run["rows"], label) for run in runs) if r]
        if len(accs) > 1:
            lines.append(
                f"- {label}: mean over {len(accs)} seeds {_pct(statistics.fmean(accs))} "
                f"± {100 * statistics.stdev(accs):.1f} pp (sample standard deviation)."
            )
    for first, second in (
        ("exact gossip", "PowerGossip r1"),
        ("PowerGossip r1, 2 iterations", "exact gossip"),
    ):
        gaps = []
        for run in runs:
            a, b = _row(run["rows"], first), _row(run["rows"], second)
            if a and b:
                gaps.append((run["setting"].get("seed", 0), 100 * (a["acc_avg"] - b["acc_avg"])))
        if len(gaps) > 1:
            lines.append(
                f"- {first} minus {second}, per seed: "
                + ", ".join(f"seed {seed}: {gap:+.1f} pp" for seed, gap in gaps)
                + f" (mean {statistics.fmean(g for _, g in gaps):+.1f} pp)."
            )
    return lines + [""]


def _standard_error(p: float, n: int) -> float:
    """The binomial standard error of an accuracy p measured on n test images."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def _distances(row: Dict[str, Any]) -> str:
    return ", ".join(f"{e['consensus_distance']:.3g}" for e in row["evals"])


def _findings(rows: List[Dict[str, Any]], n_test: int, peers: int) -> List[str]:
    """Sentences computed from the rows (no number typed by hand), their text in findings.md."""
    say = PARTS
    ranked = sorted(rows, key=lambda r: -r["acc_avg"])
    se = 100 * _standard_error(0.75, n_test)
    ranking = " > ".join(f"{r['label']} ({_pct(r['acc_avg'])})" for r in ranked)
    lines = [
        "## Findings",
        "",
        say["ranking"].format(ranking=ranking, n_test=n_test, se=se, se2=2 * se),
    ]
    allreduce, exact = _row(rows, "all-reduce"), _row(rows, "exact gossip")
    if allreduce and exact:
        lines.append(
            say["allreduce"].format(
                allreduce=_pct(allreduce["acc_avg"]),
                exact=_pct(exact["acc_avg"]),
                allreduce_loss=allreduce["evals"][-1]["train_loss"],
                exact_loss=exact["evals"][-1]["train_loss"],
                distances=_distances(exact),
                steps=exact["steps"],
                peers=peers,
            )
        )
        stale = [
            e
            for e in allreduce["evals"]
            if e["acc_avg"] - e["acc_local_mean"] > 2 * _standard_error(e["acc_avg"], n_test)
        ]
        if stale:
            e = stale[0]
            local, averaged = _pct(e["acc_local_mean"]), _pct(e["acc_avg"])
            lines.append(say["stale"].format(epoch=e["epoch"], local=local, averaged=averaged))
    lines += _compression(say, rows, n_test) + _equal_budget_and_local_steps(say, rows)
    return lines + [""]


def _compression(say: Dict[str, str], rows: List[Dict[str, Any]], n_test: int) -> List[str]:
    """The findings on PowerGossip's compression: r1 against exact gossip, more iterations, rank 2."""
    lines, exact, r1 = [], _row(rows, "exact gossip"), _row(rows, "PowerGossip r1")
    r2, two = _row(rows, "PowerGossip r2"), _row(rows, "PowerGossip r1, 2 iterations")
    if exact and r1:
        slow = (
            r1["evals"][-1]["consensus_distance"] < r1["evals"][0]["consensus_distance"]
            and r1["consensus_distance"] > 100 * exact["consensus_distance"]
        )
        lines.append(
            say["r1"].format(
                gap=100 * (exact["acc_avg"] - r1["acc_avg"]),
                fewer=exact["mb_per_peer"] / r1["mb_per_peer"],
                r1_distances=_distances(r1),
                exact_distances=_distances(exact),
                slow=say["slow"] if slow else "",
            )
        )
    for other, what in ((two, "2 power iterations"), (r2, "rank 2")):
        if other and r1 and exact:
            lines.append(
                say["more"].format(
                    what=what,
                    acc=_pct(other["acc_avg"]),
                    r1=_pct(r1["acc_avg"]),
                    exact=_pct(exact["acc_avg"]),
                    distances=_distances(other),
                    bytes=other["mb_per_peer"] / r1["mb_per_peer"],
                )
            )
    if exact and r1 and (two or r2):
        better = [
            o
            for o in (two, r2)
            if o
            and o["consensus_distance"] < r1["consensus_distance"]
            and o["acc_avg"] - r1["acc_avg"] > 2 * _standard_error(r1["acc_avg"], n_test)
        ]
        labels = " and ".join(o["label"] for o in better)
        lines.append(say["better"].format(labels=labels) if better else say["not better"])
    if (
        two
        and exact
        and two["acc_avg"] - exact["acc_avg"] > 2 * _standard_error(exact["acc_avg"], n_test)
        and two["consensus_distance"] > exact["consensus_distance"]
    ):
        lines.append(
            say["above exact"].format(two=_pct(two["acc_avg"]), exact=_pct(exact["acc_avg"]))
        )
    return lines


def _equal_budget_and_local_steps(say: Dict[str, str], rows: List[Dict[str, Any]]) -> List[str]:
    """The findings at the smallest equal-bytes budget and on local steps."""
    lines, h1, budgets = [], _row(rows, "exact gossip"), _budgets(rows)
    if budgets:
        label, mb = budgets[0]
        within = [(r, accuracy_at(r, mb)) for r in rows if r["algorithm"] != "allreduce"]
        reached = sorted(((r, e) for r, e in within if e), key=lambda x: -x[1]["acc_avg"])
        missing = ", ".join(r["label"] for r, e in within if e is None)
        lines.append(
            say["equal bytes finding"].format(
                label=label,
                mb=mb,
                reached=", ".join(
                    f"{r['label']} {_pct(e['acc_avg'])} (epoch {e['epoch']})" for r, e in reached
                ),
                missing=f"; {missing} had not reached an evaluation within that budget"
                if missing
                else "",
            )
        )
    for label in ("exact gossip H=4", "exact gossip H=16"):  # H=1 is exact gossip
        r = _row(rows, label)
        if r and h1:
            lines.append(
                say["local steps"].format(
                    label=label,
                    acc=_pct(r["acc_avg"]),
                    local=_pct(r["acc_local_mean"]),
                    h1_acc=_pct(h1["acc_avg"]),
                    h1_local=_pct(h1["acc_local_mean"]),
                    distances=_distances(r),
                    mb=r["mb_per_peer"],
                    h1_mb=h1["mb_per_peer"],
                    rounds=r["rounds"],
                    h1_rounds=h1["rounds"],
                )
            )
    return lines
