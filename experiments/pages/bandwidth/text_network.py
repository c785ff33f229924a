"""The bandwidth page's sections on the network: a step's cost at each rate, the evaluations'
traffic, one slow link, the complete runs on the cluster, latency."""

from __future__ import annotations

import statistics
from typing import Any, List, Mapping

from . import compose
from .compose import rate_text, seconds_text
from .recipe import Setting
from experiments.pages._markdown import Cell, columns, fill, g3, table
from .text import TEXT, _label, _mb, paragraph


def _periods(x) -> str:
    c, key = x["c"], x["key"]
    return str(c["periods"][key]) if key in c["periods"] else f"{c['borrowed'][key]}'s"


COST_COLUMNS = (
    ("algorithm", lambda x: _label(x["key"])),
    ("MB sent / host", lambda x: _mb(x["bytes_sent"])),
    ("comm projected (s)", g3("comm_projected")),
    ("comm, egress model (s)", g3("comm_egress")),
    ("comm replayed (s)", g3("comm_replayed")),
    ("comm in training (s)", g3("comm_in_training")),
    ("compute alone, CPU (s)", g3("cpu_alone")),
    ("compute, shared cores (s)", lambda x: f"{x['compute_shared'] + x['arith_shared']:.3g}"),
    ("step, core each (s)", g3("core_each")),
    ("step, measured (s)", g3("measured")),
    ("periods", _periods),
)


def cost_sections(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = []
    for topology, by_rate in f["costs"].items():
        for rate in s.rates:
            c = by_rate.get(rate)
            if c is None:
                continue
            lines += [f"## A step's cost: {topology}, {rate_text(rate)} per host", ""]
            items = [dict(x, key=key, c=c) for key, x in c["steps"].items()]
            lines += columns(COST_COLUMNS, items)
            lines += _link_line(rate, c)
        lines += _projection_gap(topology, by_rate, s.rates)
    return lines


def _link_line(rate: str, c: Mapping[str, Any]) -> List[str]:
    """What the link carried in one long TCP stream, and the TCP retransmissions."""
    found, shares = [], c.get("retransmitted", {})
    if c.get("link_bits"):
        top = compose.rate_bits(rate) * compose.PAYLOAD_SHARE
        mbit, share = c["link_bits"] / 1e6, c["link_bits"] / top
        found.append(fill(TEXT["link check"], mbit=mbit, share=share, top=top / 1e6))
    if c.get("link_error"):
        found.append(f"Link check failed: {c['link_error']}.")
    if shares.get("replay") and shares.get("training"):
        found.append(fill(TEXT["retransmitted"], r=shares["replay"], t=shares["training"]))
    return [" ".join(found), ""] if found else []


def _projection_gap(topology: str, by_rate: Mapping, rates) -> List[str]:
    """How far the replayed communication is from the projection and from the egress model."""
    gossip, reduce_ = [], []
    egress = []
    for rate in rates:
        for key, x in by_rate.get(rate, {}).get("steps", {}).items():
            if x["comm_projected"] <= 0 or x["comm_replayed"] < 0.05:
                continue  # below 50 ms a step's fixed costs, not the link, decide
            ratio = x["comm_replayed"] / x["comm_projected"]
            (reduce_ if key in ("allreduce", "powersgd") else gossip).append(ratio)
            egress.append(x["comm_replayed"] / x["comm_egress"])
    if not gossip and not reduce_:
        return []
    parts = []
    if gossip:
        parts.append(
            f"gossip rows {min(gossip):.2f}–{max(gossip):.2f}× the projection "
            f"(median {statistics.median(gossip):.2f})"
        )
    if reduce_:
        parts.append(f"all-reduce rows {min(reduce_):.2f}–{max(reduce_):.2f}×")
    low, high = min(egress), max(egress)
    payload = compose.PAYLOAD_SHARE
    return paragraph(
        "projection", topology=topology, parts="; ".join(parts), payload=payload, low=low, high=high
    )


def eval_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = ["## Evaluation and monitoring traffic", ""]
    rows = []
    for topology, by_rate in f["costs"].items():
        for rate in s.rates:
            c = by_rate.get(rate)
            if c is None or c["eval"] is None:
                continue
            e = c["eval"]
            step = c["steps"].get("pg-r1") or next(iter(c["steps"].values()))
            rows.append(
                [topology, rate_text(rate), _mb(e["metric_bytes"]), f"{e['core_each']:.3g}"]
                + [f"{e['measured']:.3g}", f"{e['core_each'] / step['core_each']:.3g}"]
            )
    head = ["topology", "rate", "MB sent / host per evaluation", "evaluation, core each (s)"]
    lines += table(head + ["measured (s)", "÷ a PowerGossip r1 step (core each)"], rows)
    runs = []
    for topology, per in f["accuracy"].items():
        for key, e in per.items():
            if "mb_total" in e and e["mb_total"] > 0:
                runs.append(
                    f"{_label(key)} {e['metric_mb_total'] / e['mb_total']:.3g}×" + f" ({topology})"
                )
    return lines + paragraph("evaluations", runs="; ".join(runs))


def _before_after(field: str) -> Cell:
    return lambda x: f"{x[field][0]:.3g} → {x[field][1]:.3g}"


def _cost(field: str) -> Cell:
    return lambda x: f"{x[field][1] / x[field][0]:.3g}×"


SLOW_COLUMNS = (
    ("algorithm", lambda x: _label(x["key"])),
    ("core each", _before_after("core_each")),
    ("cost (core each)", _cost("core_each")),
    ("measured", _before_after("measured")),
    ("cost (measured)", _cost("measured")),
)


def slow_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    if not f["slow_host"]:
        return []
    base, host, rate = s.slow
    lines = [f"## One slow link: {host} at {rate_text(rate)}, the others at {rate_text(base)}", ""]
    for topology, per in f["slow_host"].items():
        lines += [f"{topology}: seconds per step, all at {rate_text(base)} → {host} slowed:", ""]
        lines += columns(SLOW_COLUMNS, [dict(x, key=k) for k, x in per.items()])
        cost = {k: x["core_each"][1] / x["core_each"][0] for k, x in per.items()}
        worst, least = max(cost, key=cost.get), min(cost, key=cost.get)
        most, fewest = cost[worst], cost[least]
        lines += paragraph(
            "slow",
            topology=topology,
            worst=_label(worst),
            least=_label(least),
            most=most,
            fewest=fewest,
        )
    return lines


def e2e_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    if not f["e2e"]:
        return []
    lines = ["## Check: complete runs on the cluster", ""]
    rows = []
    for e in f["e2e"]:
        if "skipped" in e:
            rows.append([_label(e["algorithm"]), e["topology"], rate_text(e["rate"])] + [""] * 5)
            lines.append(f"Not run: {e['skipped']}")
            continue
        composed = "—" if e["composed_wall"] is None else seconds_text(e["composed_wall"])
        gap = "—" if e["gap"] is None else f"{100 * e['gap']:+.1f} %"
        worst = e["largest_gap_at_evaluations"]
        rows.append(
            [_label(e["algorithm"]), e["topology"], rate_text(e["rate"])]
            + [f"{e['steps']} steps, {e['evaluations']} evaluations"]
            + [seconds_text(e["measured_wall"]), composed]
            + [gap + ("" if worst is None else f" ({100 * worst:+.1f} % at worst)")]
            + [("yes" if e["same_models"] else "**NO**") + f" ({e['peers']} peers)"]
        )
    lines += table(TEXT["e2e header"], rows)
    return lines + paragraph("e2e")


def notes(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = ["## No latency", ""]
    rounds = {}
    for by_rate in f["costs"].values():
        for c in by_rate.values():
            for key, x in c["steps"].items():
                rounds.setdefault(key, x["rounds"])
    if rounds:
        cells = ", ".join(f"{_label(k)} {v:g}" for k, v in rounds.items())
        reduce_ = [(k, v) for k, v in rounds.items() if k in ("allreduce", "powersgd")]
        added = ", ".join(f"{_label(k)} {1000 * 0.01 * v:.0f} ms" for k, v in reduce_)
        lines += paragraph("latency", cells=cells, added=added)
    return lines
