"""The bandwidth page's sections on the network: a step's cost at each rate, the evaluations'
traffic, one slow link, the complete runs on the cluster, latency."""

from __future__ import annotations

import statistics
from typing import Any, List, Mapping

from experiments.pages._markdown import fill, table

from .compose import PAYLOAD_SHARE, rate_bits, rate_text, seconds_text
from .recipe import Setting
from .text import TEXT, _label, _mb, paragraph


#: The all-reduces (one ring of all hosts) among the rows.
REDUCE = ("allreduce", "powersgd")


def cost_sections(s: Setting, f: Mapping[str, Any]) -> List[str]:
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
        median = statistics.median(gossip)
        parts.append(
            f"gossip rows {min(gossip):.2f}–{max(gossip):.2f}× the projection (median {median:.2f})"
        )
    if reduce_:
        parts.append(f"all-reduce rows {min(reduce_):.2f}–{max(reduce_):.2f}×")
    fields = dict(topology=topology, parts="; ".join(parts), payload=PAYLOAD_SHARE)
    return paragraph("projection", **fields, low=min(egress), high=max(egress))


def eval_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    rows = []
    for topology, by_rate in f["costs"].items():
        for rate in (r for r in s.rates if by_rate.get(r, {}).get("eval")):
            c = by_rate[rate]
            e, step = c["eval"], c["steps"].get("pg-r1") or next(iter(c["steps"].values()))
            cells = [_mb(e["metric_bytes"]), f"{e['core_each']:.3g}", f"{e['measured']:.3g}"]
            rows.append(
                [topology, rate_text(rate), *cells, f"{e['core_each'] / step['core_each']:.3g}"]
            )
    out = ["## Evaluation and monitoring traffic", ""] + table(TEXT["eval header"], rows)
    runs = [
        f"{_label(key)} {e['metric_mb_total'] / e['mb_total']:.3g}× ({topology})"
        for topology, per in f["accuracy"].items()
        for key, e in per.items()
        if e.get("mb_total", 0) > 0
    ]
    return out + paragraph("evaluations", runs="; ".join(runs))


def slow_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
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
        out.append("")
        cost = {k: x["core_each"][1] / x["core_each"][0] for k, x in per.items()}
        worst, least = max(cost, key=cost.get), min(cost, key=cost.get)
        fields = dict(
            worst=_label(worst), least=_label(least), most=cost[worst], fewest=cost[least]
        )
        out += paragraph("slow", topology=topology, **fields)
    return out


def e2e_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
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
        gap = ("—" if gap is None else f"{100 * gap:+.1f} %") + (
            "" if worst is None else f" ({100 * worst:+.1f} % at worst)"
        )
        run = f"{e['steps']} steps, {e['evaluations']} evaluations"
        same = ("yes" if e["same_models"] else "**NO**") + f" ({e['peers']} peers)"
        rows.append(lead + [run, seconds_text(e["measured_wall"]), composed, gap, same])
    return out + table(TEXT["e2e header"], rows) + paragraph("e2e")


def notes(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """No latency: the message rounds per step, and what a 10 ms round trip adds to them."""
    rounds = {}
    for c in (c for by_rate in f["costs"].values() for c in by_rate.values()):
        for key, x in c["steps"].items():
            rounds.setdefault(key, x["rounds"])
    if not rounds:
        return ["## No latency", ""]
    cells = ", ".join(f"{_label(k)} {v:g}" for k, v in rounds.items())
    added = ", ".join(
        f"{_label(k)} {1000 * 0.01 * v:.0f} ms" for k, v in rounds.items() if k in REDUCE
    )
    return ["## No latency", ""] + paragraph("latency", cells=cells, added=added)
