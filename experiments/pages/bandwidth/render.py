"""bandwidth.md, bandwidth.json and bandwidth.png from the rows (`figures.collect`), pure: the
page's order, its sections on the network (a step's cost at each rate, the evaluations' traffic,
one slow link, the complete runs on the cluster, latency), the run facts and the plot."""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter, defaultdict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._figures import png, pyplot
from experiments.pages._markdown import fill, table

from . import text
from .figures import PAYLOAD_SHARE, collect, rate_bits, schedule
from .recipe import ALGORITHMS, BY_KEY, FULL, QUICK, Setting
from .text import TEXT, _label, _mb, paragraph, rate_text, seconds_text

#: The all-reduces (one ring of all hosts) among the rows.
REDUCE = tuple(a.key for a in ALGORITHMS if a.over_all_hosts)
#: The issue's bound on a host fault: every rank gone within 30 s, naming the host.
ISSUE_SECONDS = 30.0
LAUNCHERS = {"torch": "torchrun", "mpi": "mpiexec"}


def render(rows: Rows) -> Outputs:
    """bandwidth.md, bandwidth.json and (once a time to the target exists) bandwidth.png."""
    s, data = QUICK if rows.quick else FULL, {r.key: r.row for r in rows.records}
    f, facts = collect(s, data), run_facts(rows, data)
    page = [f"# Time to accuracy under bandwidth limits{' (--quick)' if rows.quick else ''}", ""]
    page += [made_by(rows) + " " + facts["sentence"], "", *text.method(s, f)]
    page += text.answer_section(s, f) + text.accuracy_section(s, f) + cost_sections(s, f)
    page += text.time_sections(s, f) + eval_section(s, f) + slow_section(s, f)
    page += e2e_section(f) + faults_section(s.faults, data) + notes(f)
    out: Outputs = {"bandwidth.md": "\n".join(page).rstrip() + "\n"}
    accuracy = {
        t: {k: {x: y for x, y in v.items() if x != "curves"} for k, v in per.items()}
        for t, per in f["accuracy"].items()
    }
    shown = dict(f, accuracy=accuracy, machine_seconds=facts["seconds"])
    shown["faults"] = {k: v for k, v in data.items() if k.startswith("fault/")}
    out["bandwidth.json"] = json.dumps(shown, indent=1, sort_keys=True) + "\n"
    if f["times"]:
        out["bandwidth.png"] = plot(s, f)
    return out


def run_facts(rows: Rows, data: Mapping[str, Dict[str, Any]]) -> Dict[str, Any]:
    """What the rows say about how they were made: machine time by kind, load, niceness, cores."""
    seconds: Dict[str, float] = defaultdict(float)
    by_commit: Dict[str, Counter] = defaultdict(Counter)
    for record in rows.records:
        seconds[record.key.split("/")[0]] += record.seconds
        by_commit[record.commit][record.key.split("/")[0]] += 1
    measured = [r for k, r in data.items() if k.split("/")[0] in ("alone", "timing", "e2e")]
    loads = [x for r in measured for x in (r.get("load_before"), r.get("load_after")) if x]
    parts = ", ".join(f"{kind} {seconds_text(v)}" for kind, v in seconds.items())
    sentence = fill(TEXT["run time"], parts=parts)
    if len(by_commit) > 1:
        commits = "; ".join(
            f"{commit}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items())
            for commit, kinds in by_commit.items()
        )
        sentence += " " + fill(TEXT["commits"], commits=commits)
    if loads:
        nice = ", ".join(str(n) for n in sorted({r["nice"] for r in measured if "nice" in r}))
        cpus = ", ".join(str(n) for n in sorted({r["cpus"] for r in measured if "cpus" in r}))
        low, high = min(x[0] for x in loads), max(x[0] for x in loads)
        nice = f", niceness {nice}" if nice else ""
        sentence += " " + fill(TEXT["load"], cpus=cpus or "?", low=low, high=high, nice=nice)
    return {"seconds": dict(seconds), "sentence": sentence}


def cost_sections(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """A step's cost per topology and rate: the table, the link check, the projection's gap."""
    out = []
    for topology, by_rate in f["costs"].items():
        for rate, c in ((r, by_rate[r]) for r in s.rates if r in by_rate):
            out += [f"## A step's cost: {topology}, {rate_text(rate)} per host", ""]
            out += [TEXT["cost table"]] + [_cost_row(c, k, x) for k, x in c["steps"].items()]
            out += [""] + _link_line(rate, c)
        out += _projection_gap(topology, by_rate, s.rates)
    return out


def _cost_row(c: Mapping[str, Any], key: str, x: Mapping[str, Any]) -> str:
    """A row of a step's cost table; its periods, or whose they are where borrowed."""
    periods = c["periods"][key] if key in c["periods"] else f"{c['borrowed'][key]}'s"
    shared, mb = x["compute_shared"] + x["arith_shared"], _mb(x["bytes_sent"])
    return fill(TEXT["cost row"], x=x, label=_label(key), mb=mb, shared=shared, periods=periods)


def _link_line(rate: str, c: Mapping[str, Any]) -> List[str]:
    """What the link carried in one long TCP stream, and the TCP retransmissions."""
    found, shares = [], c.get("retransmitted", {})
    if c.get("link_bits"):
        top = rate_bits(rate) * PAYLOAD_SHARE
        mbit, share = c["link_bits"] / 1e6, c["link_bits"] / top
        found.append(fill(TEXT["link check"], mbit=mbit, share=share, top=top / 1e6))
    if c.get("link_error"):
        found.append(f"Link check failed: {c['link_error']}.")
    if shares.get("replay") and shares.get("training"):
        found.append(fill(TEXT["retransmitted"], r=shares["replay"], t=shares["training"]))
    return [" ".join(found), ""] if found else []


def _projection_gap(topology: str, by_rate: Mapping, rates) -> List[str]:
    """How far the replayed communication is from the projection and from the egress model
    (steps whose communication takes 50 ms or more: below, a step's fixed costs decide)."""
    steps = [(k, x) for r in rates for k, x in by_rate.get(r, {}).get("steps", {}).items()]
    steps = [(k, x) for k, x in steps if x["comm_projected"] > 0 and x["comm_replayed"] >= 0.05]
    gossip = [x["comm_replayed"] / x["comm_projected"] for k, x in steps if k not in REDUCE]
    reduce_ = [x["comm_replayed"] / x["comm_projected"] for k, x in steps if k in REDUCE]
    egress = [x["comm_replayed"] / x["comm_egress"] for _, x in steps]
    if not steps:
        return []
    parts = []
    if gossip:
        low, high, median = min(gossip), max(gossip), statistics.median(gossip)
        parts.append(f"gossip rows {low:.2f}–{high:.2f}× the projection (median {median:.2f})")
    if reduce_:
        parts.append(f"all-reduce rows {min(reduce_):.2f}–{max(reduce_):.2f}×")
    fields = dict(topology=topology, parts="; ".join(parts), payload=PAYLOAD_SHARE)
    return paragraph("projection", **fields, low=min(egress), high=max(egress))


def eval_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """An evaluation's bytes and time per topology and rate, and its traffic over a run."""
    rows = []
    for topology, by_rate in f["costs"].items():
        for rate in (r for r in s.rates if by_rate.get(r, {}).get("eval")):
            c = by_rate[rate]
            e, step = c["eval"], c["steps"].get("pg-r1") or next(iter(c["steps"].values()))
            cells = [_mb(e["metric_bytes"]), f"{e['core_each']:.3g}", f"{e['measured']:.3g}"]
            ratio = f"{e['core_each'] / step['core_each']:.3g}"
            rows.append([topology, rate_text(rate), *cells, ratio])
    out = ["## Evaluation and monitoring traffic", ""] + table(TEXT["eval header"], rows)
    runs = [
        f"{_label(key)} {e['metric_mb_total'] / e['mb_total']:.3g}× ({topology})"
        for topology, per in f["accuracy"].items()
        for key, e in per.items()
        if e.get("mb_total", 0) > 0
    ]
    return out + paragraph("evaluations", runs="; ".join(runs))


def slow_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """One host's link slowed: each algorithm's step before and after, and who pays most."""
    if not f["slow_host"]:
        return []
    base, host, rate = s.slow
    out = [f"## One slow link: {host} at {rate_text(rate)}, the others at {rate_text(base)}", ""]
    for topology, per in f["slow_host"].items():
        out += [f"{topology}: seconds per step, all at {rate_text(base)} → {host} slowed:", ""]
        out += [TEXT["slow table"]]
        for k, x in per.items():
            cost = [x[f][1] / x[f][0] for f in ("core_each", "measured")]
            fields = dict(label=_label(k), c=x["core_each"], m=x["measured"], cost=cost)
            out.append(fill(TEXT["slow row"], **fields))
        cost = {k: x["core_each"][1] / x["core_each"][0] for k, x in per.items()}
        worst, least = max(cost, key=cost.get), min(cost, key=cost.get)
        fields = dict(worst=_label(worst), least=_label(least), most=cost[worst])
        out += ["", *paragraph("slow", topology=topology, **fields, fewest=cost[least])]
    return out


def e2e_section(f: Mapping[str, Any]) -> List[str]:
    """The complete runs on the cluster against their composed time and the in-process models."""
    if not f["e2e"]:
        return []
    out, rows = ["## Check: complete runs on the cluster", ""], []
    for e in f["e2e"]:
        lead = [_label(e["algorithm"]), e["topology"], rate_text(e["rate"])]
        if "skipped" in e:
            rows.append(lead + [""] * 5)
            out.append(f"Not run: {e['skipped']}")
            continue
        composed = "—" if e["composed_wall"] is None else seconds_text(e["composed_wall"])
        gap, worst = e["gap"], e["largest_gap_at_evaluations"]
        gap = "—" if gap is None else f"{100 * gap:+.1f} %"
        gap += "" if worst is None else f" ({100 * worst:+.1f} % at worst)"
        run = f"{e['steps']} steps, {e['evaluations']} evaluations"
        same = ("yes" if e["same_models"] else "**NO**") + f" ({e['peers']} peers)"
        rows.append(lead + [run, seconds_text(e["measured_wall"]), composed, gap, same])
    return out + table(TEXT["e2e header"], rows) + paragraph("e2e")


def notes(f: Mapping[str, Any]) -> List[str]:
    """No latency: the message rounds per step, and what a 10 ms round trip adds to them."""
    rounds = {}
    for c in (c for by_rate in f["costs"].values() for c in by_rate.values()):
        for key, x in c["steps"].items():
            rounds.setdefault(key, x["rounds"])
    if not rounds:
        return ["## No latency", ""]
    cells = ", ".join(f"{_label(k)} {v:g}" for k, v in rounds.items())
    added = [f"{_label(k)} {1000 * 0.01 * v:.0f} ms" for k, v in rounds.items() if k in REDUCE]
    return ["## No latency", ""] + paragraph("latency", cells=cells, added=", ".join(added))


def plot(s: Setting, f: Mapping[str, Any]) -> bytes:
    """bandwidth.png: the averaged model's accuracy against wall time (a core per host, training
    time, the seeds' mean curve), a panel per topology and link rate."""
    plt = pyplot()
    topologies = [t for t in s.topologies if t in f["costs"]]
    rates = [r for r in s.rates if any(r in f["costs"][t] for t in topologies)]
    rows, cols = len(topologies), len(rates)
    size = (3.6 * cols, 3.0 * rows)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, sharey=True)
    colors = plt.get_cmap("tab10")
    for (i, topology), (j, rate) in itertools.product(enumerate(topologies), enumerate(rates)):
        ax, c = axes[i][j], f["costs"][topology].get(rate)
        if c is None:
            ax.set_visible(False)
            continue
        for n, key in enumerate(s.algorithms):
            curve = f["accuracy"][topology].get(key, {}).get("mean_curve")
            plan = schedule(c["steps"], c["eval"], key, "core_each")
            if plan is None or curve is None:
                continue
            xs, ys = [plan.training(step) for step, _ in curve], [100 * acc for _, acc in curve]
            style = "--" if key.startswith(("choco", "powersgd", "exact-h4")) else "-"
            ax.plot(xs, ys, style, color=colors(n), lw=1.2, label=BY_KEY[key].label)
        if f["target"] is not None:
            ax.axhline(100 * f["target"], color="gray", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(f"{topology}, {rate_text(rate)}", fontsize=9)
        ax.grid(alpha=0.3)
        if i == rows - 1:
            ax.set_xlabel("training wall time, a core per host (s)", fontsize=8)
        if j == 0:
            ax.set_ylabel("averaged-model accuracy (%)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels) or 1), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return png(fig, dpi=100)


def _seconds(value: Optional[float], none: str = "—") -> str:
    return none if value is None else f"{value:.2f}"


def _row(launcher: str, fault: str, r: Mapping[str, Any]) -> str:
    """A case's line of the section's table."""
    lost = r.get("lost_says")
    exits = ", ".join(f"{k}: {_seconds(v, 'not ended')}" for k, v in r["exits"].items())
    fields = dict(launcher=LAUNCHERS[launcher], what=TEXT[f"fault {fault}"], exits=exits)
    fields["gone"] = _seconds(r["seconds"], "not within 90 s")
    fields["named_after"] = _seconds(r["named_after"])
    fields["named"] = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in r["named"].items())
    fields["said"] = "—" if lost is None else "`" + lost.split(": ", 1)[1][:140] + "`"
    return fill(TEXT["fault row"], **fields)


def faults_section(
    cases: Sequence[Tuple[str, str]], data: Mapping[str, Dict[str, Any]]
) -> List[str]:
    """ "Faults across hosts": a line per case that has a row, against the issue's 30 s."""
    found = [(lc, f, data[f"fault/{lc}/{f}"]) for lc, f in cases if f"fault/{lc}/{f}" in data]
    skipped = [r["skipped"] for _, _, r in found if "skipped" in r]
    ran = [x for x in found if "skipped" not in x[2]]
    if not found:
        return []
    lines = ["## Faults across hosts", ""] + ([f"Not run: {skipped[0]}", ""] if skipped else [])
    if not ran:
        return lines
    late = [
        f"{LAUNCHERS[lc]} {f}"
        for lc, f, r in ran
        if r["seconds"] is None or r["seconds"] > ISSUE_SECONDS
    ]
    verdict = f"was gone within the issue's {ISSUE_SECONDS:g} s in every case"
    if late:
        verdict = f"was NOT gone within {ISSUE_SECONDS:g} s in: {', '.join(late)}"
    bound = ", ".join(f"{b:g}" for b in sorted({r["bound"] for _, _, r in ran}))
    text = fill(TEXT["faults"], verdict=verdict, bound=bound)
    return lines + [TEXT["fault table"], *(_row(*x) for x in ran), "", text, ""]
