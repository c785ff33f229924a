"""The bandwidth page's sections, as lines of markdown, from `figures.collect`'s numbers."""

from __future__ import annotations

import statistics
from typing import Any, List, Mapping, Optional

from . import compose
from .compose import rate_text, seconds_text
from .recipe import BY_KEY, Setting


def _label(key: str) -> str:
    return BY_KEY[key].label


def _pct(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.2f} %"


def _mb(value: float) -> str:
    return f"{value / 1e6:.4g}"


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def method(s: Setting, f: Mapping[str, Any], facts: Mapping[str, Any]) -> List[str]:
    b = s.base
    first = next((e for per in f["accuracy"].values() for e in per.values() if "steps" in e), {})
    target = f["target"]
    return [
        "## What was run, and how",
        "",
        f"- Training: {b['dataset']} / `{b['model']}` ({first.get('parameters', '?'):,} "
        f"parameters), SGD lr (tuned) momentum {b['momentum']}, weight decay "
        f"{b['weight_decay']}, {b['schedule']} schedule with {b['warmup_epochs']} warm-up "
        f"epoch, batch {b['batch_size']} per peer, {b['epochs']} epochs "
        f"({first.get('steps', '?')} steps), partition {b['partition']}, an evaluation of the "
        f"averaged model after every epoch; topologies {', '.join(s.topologies)}; seeds "
        + ", ".join(f"{t}: {len(v)}" for t, v in s.seeds.items())
        + ".",
        "- Accuracy against steps: in-process runs (`gossip_powersgd.run`, every peer a thread). "
        "The algorithms are synchronous and deterministic and the transports give bit-identical "
        "models, so a run on the cluster follows the same curve step for step (checked below).",
        "- A step's time: on the emulated cluster (`python -m gossip_powersgd.cluster`: one "
        "network namespace per host on one bridge, each link limited both ways by `tc tbf`), "
        "one process per host (backend torch, gloo) started with the variables torchrun sets, "
        "running the trainer's own loop: per period of H steps (H = 1, or 4 for local steps) "
        "the wall time, the algorithm's arithmetic and its time inside the transport, as the "
        "algorithm counts them; the first period is not used; the median of the rest, for the "
        "slowest host. Then the last period's messages are replayed with no computation "
        "between them (after a barrier, every host at once): communication with compute out "
        "of the way. One evaluation is timed and replayed the same way.",
        "- Three figures for a step (and an evaluation): **measured**: the cluster's step, its "
        "hosts sharing this machine's cores (compute several times slower, and waits for "
        "neighbours' compute included); **core each**: hosts with a core each, from measured "
        "parts: the CPU time of one peer's step (compute and the algorithm's arithmetic) measured "
        "alone on this machine (its neighbours echo its messages; one thread; CPU time, so that "
        "other work on the shared cores does not count), plus the replayed communication; **projected**: the "
        "same compute plus the project's own projected communication time (`CommStats`: per "
        "exchange its largest message at the link rate, 50 µs per round). Claims below name "
        "their figure; the answer uses core each.",
        "- Time to the target = the steps until the first evaluation that reaches it × the "
        "step's time (+ those evaluations, where said); PowerSGD's first 10 steps (its exact "
        "all-reduce warm-up) cost an all-reduce step. The measurements use a fixed γ and lr "
        "(a step's cost does not depend on them) and PowerSGD without its warm-up.",
        f"- **Target: {_pct(target)}** averaged-model accuracy: the highest whole percent that "
        "every run (every seed, every topology) of exact gossip, PowerGossip r1 and all-reduce "
        "reaches."
        if target is not None
        else "- No target: the compared rows are missing.",
        "",
    ]


def answer_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    if not f["answer"]:
        return ["## The answer", "", "Not measured (see below).", ""]
    return ["## The answer", ""] + [f"- {line}" for line in f["answer"]] + [""]


def accuracy_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = ["## Tuning (tuning topology " + s.tune_topology + ", seed 0)", ""]
    rows = []
    for t in f["tuning"]:
        cells = [
            f"{v['value']:g}: " + ("failed" if v["error"] else _pct(v["acc_avg"]))
            for v in t["values"]
        ]
        chosen = "—" if t["chosen"] is None else f"{t['chosen']:g}"
        rows.append([t["label"], t["tuned"], "; ".join(cells), chosen])
    lines += _table(["algorithm", "tuned", "final averaged-model accuracy", "chosen"], rows)
    lines.append(
        "The learning rate of the γ-tuned rows is the all-reduce's chosen one; the chosen value is "
        "the grid's best final accuracy. The other topologies use the chosen γ (γ ÷ topology γ "
        "for exact gossip and PowerGossip) and lr."
    )
    lines.append("")
    p = f["plateau"]
    if p:
        gain = 100 * (p["acc"][1] - p["acc"][0])
        lines += [
            f"Plateau: the best row ({_label(p['algorithm'])}, {s.tune_topology}, seed 0) at "
            f"{p['epochs'][1]} epochs instead of {p['epochs'][0]}: {_pct(p['acc'][1])} against "
            f"{_pct(p['acc'][0])} ({gain:+.2f} pp).",
            "",
        ]
    for topology, per in f["accuracy"].items():
        lines += [f"## Accuracy against steps: {topology}", ""]
        rows = []
        for key, e in per.items():
            if "finals" not in e:
                rows.append([e["label"], "", "", "", "failed: " + "; ".join(e["errors"])[:120]])
                continue
            steps = ", ".join("never" if x is None else str(x) for x in e["steps_to_target"])
            mbs = ", ".join("—" if x is None else f"{x:.4g}" for x in e["mb_to_target"])
            gamma = "—" if e.get("gamma") is None else f"{e['gamma']:.3g}"
            rows.append(
                [
                    e["label"],
                    f"{e['lr']:g} / {gamma}",
                    _final(e["finals"]),
                    steps,
                    mbs,
                    f"{e['mb_total']:.4g}",
                    f"{e['metric_mb_total']:.4g}",
                ]
            )
        lines += _table(
            [
                "algorithm",
                "lr / γ",
                "final acc (mean [min, max] over seeds)",
                f"steps to {_pct(f['target'])} (per seed)",
                "training MB / peer then",
                "training MB / peer, run",
                f"evaluation MB / peer, run ({e.get('evaluations', '?')} evaluations)",
            ],
            rows,
        )
    return lines


def _final(values: List[float]) -> str:
    mean, low, high = compose.spread(values)
    if len(values) == 1:
        return _pct(mean)
    return f"{100 * mean:.2f} % [{100 * low:.2f}, {100 * high:.2f}]"


def cost_sections(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = []
    for topology, by_rate in f["costs"].items():
        for rate in s.rates:
            c = by_rate.get(rate)
            if c is None:
                continue
            lines += [f"## A step's cost: {topology}, {rate_text(rate)} per host", ""]
            rows = []
            for key, x in c["steps"].items():
                rows.append(
                    [
                        _label(key),
                        _mb(x["bytes_sent"]),
                        f"{x['comm_projected']:.3g}",
                        f"{x['comm_egress']:.3g}",
                        f"{x['comm_replayed']:.3g}",
                        f"{x['comm_in_training']:.3g}",
                        f"{x['cpu_alone']:.3g}",
                        f"{x['compute_shared'] + x['arith_shared']:.3g}",
                        f"{x['core_each']:.3g}",
                        f"{x['measured']:.3g}",
                        str(c["periods"][key]),
                    ]
                )
            lines += _table(
                [
                    "algorithm",
                    "MB sent / host",
                    "comm projected (s)",
                    "comm, egress model (s)",
                    "comm replayed (s)",
                    "comm in training (s)",
                    "compute alone, CPU (s)",
                    "compute, shared cores (s)",
                    "step, core each (s)",
                    "step, measured (s)",
                    "periods",
                ],
                rows,
            )
        lines += _projection_gap(topology, by_rate, s.rates)
    return lines


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


def time_sections(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = []
    target = _pct(f["target"])
    for topology, by_rate in f["times"].items():
        rates = [r for r in s.rates if r in by_rate]
        for figure, evals, what in (
            ("core_each", False, "hosts with a core each, training time"),
            ("core_each", True, "hosts with a core each, with an evaluation after every epoch"),
            ("measured", False, "measured on the cluster (cores shared), training time"),
            ("projected", False, "projected (compute alone + the project's projected comm)"),
        ):
            key = figure + ("_with_evals" if evals else "")
            lines += [f"## Time to {target}: {topology}, {what}", ""]
            rows = []
            for algorithm in s.algorithms:
                cells = [_seconds_cell(by_rate[r].get(algorithm, {}).get(key)) for r in rates]
                rows.append([_label(algorithm)] + cells)
            lines += _table(["algorithm"] + [rate_text(r) for r in rates], rows)
        lines.append(
            "Mean over seeds [fastest, slowest seed]; 'not reached': some seed never reaches "
            "the target."
        )
        lines.append("")
    return lines


def _seconds_cell(entry: Optional[Mapping]) -> str:
    if entry is None:
        return "—"
    if entry["mean"] is None:
        return "not reached"
    if entry["min"] == entry["max"]:
        return seconds_text(entry["mean"])
    return f"{seconds_text(entry['mean'])} [{seconds_text(entry['min'])}, {seconds_text(entry['max'])}]"


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
                [
                    topology,
                    rate_text(rate),
                    _mb(e["metric_bytes"]),
                    f"{e['core_each']:.3g}",
                    f"{e['measured']:.3g}",
                    f"{e['core_each'] / step['core_each']:.3g}",
                ]
            )
    lines += _table(
        [
            "topology",
            "rate",
            "MB sent / host per evaluation",
            "evaluation, core each (s)",
            "measured (s)",
            "÷ a PowerGossip r1 step (core each)",
        ],
        rows,
    )
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


def slow_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    if not f["slow_host"]:
        return []
    base, host, rate = s.slow
    lines = [f"## One slow link: {host} at {rate_text(rate)}, the others at {rate_text(base)}", ""]
    for topology, per in f["slow_host"].items():
        rows = []
        for key, x in per.items():
            rows.append(
                [
                    _label(key),
                    f"{x['core_each'][0]:.3g} → {x['core_each'][1]:.3g}",
                    f"{x['core_each'][1] / x['core_each'][0]:.3g}×",
                    f"{x['measured'][0]:.3g} → {x['measured'][1]:.3g}",
                    f"{x['measured'][1] / x['measured'][0]:.3g}×",
                ]
            )
        lines += [f"{topology}: seconds per step, all at {rate_text(base)} → {host} slowed:", ""]
        lines += _table(
            ["algorithm", "core each", "cost (core each)", "measured", "cost (measured)"], rows
        )
        worst = max(per, key=lambda k: per[k]["core_each"][1] / per[k]["core_each"][0])
        least = min(per, key=lambda k: per[k]["core_each"][1] / per[k]["core_each"][0])
        lines += [
            f"On {topology} (core each) the slow link costs {_label(worst)} the most "
            f"({per[worst]['core_each'][1] / per[worst]['core_each'][0]:.3g}× per step) and "
            f"{_label(least)} the least "
            f"({per[least]['core_each'][1] / per[least]['core_each'][0]:.3g}×): every algorithm "
            "here is synchronous, so each step waits for the slow host's messages (gossip: its "
            "neighbours, and theirs the next step; all-reduce: the ring through it).",
            "",
        ]
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
            [
                _label(e["algorithm"]),
                e["topology"],
                rate_text(e["rate"]),
                f"{e['steps']} steps, {e['evaluations']} evaluations",
                seconds_text(e["measured_wall"]),
                composed,
                gap + ("" if worst is None else f" ({100 * worst:+.1f} % at worst)"),
                ("yes" if e["same_models"] else "**NO**") + f" ({e['peers']} peers)",
            ]
        )
    lines += _table(
        [
            "algorithm",
            "topology",
            "rate",
            "run",
            "measured wall (training loop)",
            "composed (measured figure)",
            "composed ÷ measured − 1 (at the evaluations: largest)",
            "final models = in-process, bit for bit",
        ],
        rows,
    )
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
