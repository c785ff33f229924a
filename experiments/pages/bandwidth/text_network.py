"""The bandwidth page's sections on the network: a step's cost at each rate, the evaluations'
traffic, one slow link, the complete runs on the cluster, latency."""

from __future__ import annotations

import statistics
from typing import Any, List, Mapping

from . import compose
from .compose import rate_text, seconds_text
from .recipe import Setting
from experiments.pages._markdown import Cell, columns, g3, table
from .text import _label, _mb


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
    parts = []
    if c.get("link_bits"):
        top = compose.rate_bits(rate) * compose.PAYLOAD_SHARE
        parts.append(
            f"Link check: one TCP stream host1 → host0 for about 3 s carried "
            f"{c['link_bits'] / 1e6:.4g} Mbit/s of payload ({c['link_bits'] / top:.1%} of the "
            f"{top / 1e6:.4g} a tbf rate lets through)."
        )
    if c.get("link_error"):
        parts.append(f"Link check failed: {c['link_error']}.")
    shares = c.get("retransmitted", {})
    if shares.get("replay") and shares.get("training"):
        r, t = shares["replay"], shares["training"]
        parts.append(
            f"TCP retransmitted {r['share']:.2%} of the segments the hosts sent in the replays "
            f"({r['timeouts']} retransmission timeouts) and {t['share']:.2%} in the timed "
            f"training ({t['timeouts']} timeouts)."
        )
    return [" ".join(parts), ""] if parts else []


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
    return [
        f"Replayed communication on {topology}, steps whose communication takes 50 ms or more: "
        + "; ".join(parts)
        + f"; against the egress model (every byte a host sends through its one link at "
        f"{compose.PAYLOAD_SHARE:.3f} × the rate, the TCP payload a tbf rate carries) "
        f"{min(egress):.2f}–{max(egress):.2f}×. Why: the projection charges an exchange its "
        "largest message, as if each neighbour had a link of its own; a host has one link, "
        "which its messages to all its neighbours share (a ring host sends 2 per exchange, a "
        "torus:2x4 host 3), and TCP carries at most 95.6 % of a tbf rate. A ring all-reduce "
        "sends one message at a time, which the projection charges in full.",
        "",
    ]


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
    lines += [
        "An evaluation (each peer's local test accuracy, the averaged model: an all-reduce of "
        "the float64 parameters; the consensus distance: another) is metric traffic, counted "
        "apart from training traffic and left out of the training times above. Over a whole "
        "run, the evaluations sent this many times each row's training traffic: "
        + "; ".join(runs)
        + ". A deployment pays it unless evaluations are rare or local.",
        "",
    ]
    return lines


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
        lines += [
            f"On {topology} (core each) the slow link costs {_label(worst)} the most "
            f"({cost[worst]:.3g}× per step) and {_label(least)} the least "
            f"({cost[least]:.3g}×): every algorithm "
            "here is synchronous, so each step waits for the slow host's messages (gossip: its "
            "neighbours, and theirs the next step; all-reduce: the ring through it).",
            "",
        ]
    return lines


E2E_HEADER = (
    "algorithm",
    "topology",
    "rate",
    "run",
    "measured wall (training loop)",
    "composed (measured figure)",
    "composed ÷ measured − 1 (at the evaluations: largest)",
    "final models = in-process, bit for bit",
)


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
    lines += table(E2E_HEADER, rows)
    lines += [
        "Each run: `torchrun --nnodes N --nproc-per-node 1 --rdzv-backend c10d` on every host, "
        "`-m gossip_powersgd.cli.train` with the in-process row's config (backend torch), as a "
        "user launches it; composed = its steps × the measured step + its evaluations × the "
        "measured evaluation, from the step-time row of the same topology and rate (made at "
        "another time: the machine's load differs between them).",
        "",
    ]
    return lines


def notes(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = ["## No latency", ""]
    rounds = {}
    for by_rate in f["costs"].values():
        for c in by_rate.values():
            for key, x in c["steps"].items():
                rounds.setdefault(key, x["rounds"])
    if rounds:
        cells = ", ".join(f"{_label(k)} {v:g}" for k, v in rounds.items())
        lines += [
            "netem is not available here, so the links add no latency: every figure above is "
            "for a network whose only limit is its rate. Where latency matters: each "
            f"sequential round of messages pays it once. Rounds per step: {cells}. At a 10 ms "
            "round trip a ring all-reduce's rounds alone add "
            + ", ".join(
                f"{_label(k)} {1000 * 0.01 * v:.0f} ms"
                for k, v in rounds.items()
                if k in ("allreduce", "powersgd")
            )
            + " per step, a gossip step a few tens of ms at most.",
            "",
        ]
    return lines
