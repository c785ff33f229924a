"""`python -m experiments.suite dynamic`: gossip on 16 peers over static graphs (ring, torus 4×4)
and graphs that change every step (one-peer exponential, random matchings), for exact gossip and
PowerGossip r1, plus push-sum on the directed exponential schedule. Two sections, one page:
consensus (error vs bits on the consensus page's 100×100 matrix problem) and training (MNIST-1D
cnn1d, iid: accuracy vs MB and vs projected wall time). The question the page answers: does
PowerGossip on a one-peer schedule need fewer bytes than on a ring or torus for the same accuracy?
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gossip_powersgd.utils import atomic_write

from experiments.consensus.matched import bits_to_reach, error_at_bits
from experiments.consensus.matched import positive_points as _positive  # noqa: F401 (names others import from here)

from .dynamic_design import (  # noqa: F401 (the design's names, importable from here)
    ALGORITHMS,
    BUDGETS,
    MAX_BITS,
    MAX_STEPS,
    POWERGOSSIP,
    PUSHSUM,
    SCHEDULES,
    TARGETS,
    TOPOLOGIES,
    TRAINING_EPOCHS,
)
from .dynamic_plots import plot_consensus, plot_training, training_curve_time
from .runs import BANDWIDTHS, BASE, QUICK_BASE, attempt, log
from .tables import _pct, build_csv, build_table, header


def plan(quick: bool, epochs: int) -> Dict[str, Any]:
    """What to run: the full page, or (quick) 4 peers, an 8×8 matrix and 1 epoch of logistic regression."""
    if quick:
        return dict(
            quick=True,
            topologies=("ring:4", "one_peer_exponential:4", "matchings:4"),
            schedules=("one_peer_exponential:4", "matchings:4"),
            pushsum=("directed_exponential:4",) + PUSHSUM[1:],
            problem="matrix:8",
            budgets=(1e3, 1e4),
            max_bits=1e4,
            max_steps=200,
            epochs=1,
        )
    return dict(
        quick=False,
        topologies=TOPOLOGIES,
        schedules=SCHEDULES,
        pushsum=PUSHSUM,
        problem="matrix",
        budgets=BUDGETS,
        max_bits=MAX_BITS,
        max_steps=MAX_STEPS,
        epochs=epochs,
    )


def cases(p: Dict[str, Any]) -> List[Tuple[str, str, str, str]]:
    """(topology, label, consensus spec, training spec) of every row, in the tables' order."""
    rows = [
        (topology, label, cspec, tspec)
        for topology in p["topologies"]
        for label, cspec, tspec in ALGORITHMS
    ]
    return rows + [tuple(p["pushsum"])]


# --------------------------------------------------------------------------------------------------
# consensus section


def run_consensus_case(topology: str, label: str, spec: str, p: Dict[str, Any]) -> Dict[str, Any]:
    """One consensus run on every peer (threads); its curve and the row's numbers."""
    import topologies

    from experiments.consensus.measure import DIVERGE_FACTOR, consensus_curve
    from gossip_powersgd.launch import run_peers

    row: Dict[str, Any] = dict(topology=topology, label=label, spec=spec)
    try:
        graph = topologies.parse(topology)
        values = run_peers(
            graph,
            consensus_curve,
            p["problem"],
            spec,
            p["max_steps"],
            p["max_bits"],
            p["budgets"],
            DIVERGE_FACTOR,
            min(TARGETS) / 2,
            backend="local",
        )
    except Exception as exc:  # a failing run is a row saying so, not a lost page
        row["error_text"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
        log(f"  FAILED: {row['error_text']}")
        return row
    first = values[0]
    if any(values[rank]["history"] != first["history"] for rank in values):
        raise RuntimeError(f"{topology} {spec}: the peers recorded different histories")
    history = first["history"]
    row.update(
        history=history,
        stop=first["stop"],
        seconds=first["seconds"],
        steps=history[-1]["step"],
        bits_run=history[-1]["bits_per_peer"],
        error0=history[0]["error"],
        at_budget={b: _relative(error_at_bits(history, b), history) for b in p["budgets"]},
        to_reach={t: bits_to_reach(history, t) for t in TARGETS},
    )
    log(
        f"  {row['steps']} steps, {row['bits_run']:.3g} bits, relative error "
        f"{history[-1]['error'] / row['error0']:.3g} ({row['stop']}), {row['seconds']:.1f} s"
    )
    return row


def _relative(error: Optional[float], history: Sequence[Dict]) -> Optional[float]:
    return None if error is None else error / history[0]["error"]


def _num(value: Optional[float], missing: str = "—") -> str:
    return missing if value is None else f"{value:.3g}"


def consensus_table(rows: Sequence[Dict[str, Any]], budgets: Sequence[float]) -> str:
    """Markdown: relative error at matched bits and bits to reach each target, one row per run."""
    head = (
        ["graph", "algorithm", "steps run", "bits run", "stop"]
        + [f"rel. error @ {b:.0e} bits" for b in budgets]
        + [f"bits to rel. error {t:.0e}" for t in TARGETS]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error_text" in r:
            lines.append(
                f"| {r['topology']} | {r['label']} | FAILED: {r['error_text']} |"
                + " |" * (len(head) - 3)
            )
            continue
        lines.append(
            "| "
            + " | ".join(
                [r["topology"], r["label"], str(r["steps"]), f"{r['bits_run']:.3g}", r["stop"]]
                + [_num(r["at_budget"][b]) for b in budgets]
                + [_num(r["to_reach"][t], f"not reached (> {r['bits_run']:.3g})") for t in TARGETS]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def consensus_csv(rows: Sequence[Dict[str, Any]], budgets: Sequence[float]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        ["topology", "algorithm", "spec", "steps", "bits_run", "stop", "initial_error"]
        + [f"rel_error_at_{b:g}_bits" for b in budgets]
        + [f"bits_to_{t:g}" for t in TARGETS]
        + ["seconds", "error"]
    )
    for r in rows:
        if "error_text" in r:
            writer.writerow(
                [r["topology"], r["label"], r["spec"]]
                + [""] * (4 + len(budgets) + len(TARGETS))
                + ["", r["error_text"]]
            )
            continue
        writer.writerow(
            [
                r["topology"],
                r["label"],
                r["spec"],
                r["steps"],
                r["bits_run"],
                r["stop"],
                r["error0"],
            ]
            + ["" if r["at_budget"][b] is None else f"{r['at_budget'][b]:.6g}" for b in budgets]
            + ["" if r["to_reach"][t] is None else f"{r['to_reach'][t]:.6g}" for t in TARGETS]
            + [f"{r['seconds']:.1f}", ""]
        )
    return buffer.getvalue()


# --------------------------------------------------------------------------------------------------
# training section


def _reach(curve: Sequence[Tuple[float, float]], target: float) -> Optional[float]:
    """The x at which the accuracy curve first reaches `target` (linear between evaluations)."""
    previous = None
    for x, acc in curve:
        if acc >= target:
            if previous is None or previous[1] >= acc:
                return x
            t = (target - previous[1]) / (acc - previous[1])
            return previous[0] + t * (x - previous[0])
        previous = (x, acc)
    return None


def training_target(rows: Sequence[Dict[str, Any]]) -> Optional[float]:
    """The accuracy every PowerGossip run reached: the lowest final accuracy among them."""
    finals = [r["acc_avg"] for r in rows if r["label"] == POWERGOSSIP and "error" not in r]
    return min(finals) if finals else None


def reach_table(rows: Sequence[Dict[str, Any]], target: float) -> str:
    """Markdown: MB and projected seconds per peer at which each run first reaches `target`."""
    head = ["graph", "algorithm", "final acc", f"MB to {_pct(target)}"] + [
        f"projected s to {_pct(target)} @ {name}" for name, _ in BANDWIDTHS
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            continue
        mb = _reach([(x, a) for x, a in r["curve"] if a is not None], target)
        times = [_reach(training_curve_time(r, bw), target) for _, bw in BANDWIDTHS]
        lines.append(
            "| "
            + " | ".join(
                [r["topology"], r["label"], _pct(r["acc_avg"]), _num(mb, "not reached")]
                + [_num(t, "not reached") for t in times]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# the answer


def _pg(rows: Sequence[Dict[str, Any]], topology: str) -> Optional[Dict[str, Any]]:
    return next(
        (
            r
            for r in rows
            if r["topology"] == topology
            and r["label"] == POWERGOSSIP
            and "error" not in r
            and "error_text" not in r
        ),
        None,
    )


def _compare(
    name: str,
    values: Dict[str, Optional[float]],
    schedules: Sequence[str],
    statics: Sequence[str],
    unit: str,
) -> str:
    """One verdict line: each schedule's cost against each static graph's (lower is better)."""

    def text(topology: str):
        value = values.get(topology)
        return f"{topology} {_num(value, 'not reached')}"

    parts = []
    for s in schedules:
        for g in statics:
            a, b = values.get(s), values.get(g)
            if a is None and b is None:
                parts.append(f"{s} vs {g}: neither reached it")
            elif a is None:
                parts.append(f"{s} vs {g}: **no** ({s} did not reach it)")
            elif b is None:
                parts.append(f"{s} vs {g}: **yes** ({g} did not reach it)")
            else:
                parts.append(
                    f"{s} vs {g}: **{'yes' if a < b else 'no'}**, {b / a:.2f}× "
                    f"({'fewer' if a < b else 'more' if a > b else 'equal'})"
                )
    return (
        f"- {name} ({unit}: "
        + ", ".join(text(t) for t in list(schedules) + list(statics))
        + "): "
        + "; ".join(parts)
        + "."
    )


def verdict(
    consensus: Sequence[Dict[str, Any]],
    training: Sequence[Dict[str, Any]],
    p: Dict[str, Any],
    target: Optional[float],
) -> List[str]:
    """The question answered from the rows: fewer bytes on a one-peer schedule than on a ring or torus?"""
    schedules = p["schedules"]
    statics = [t for t in p["topologies"] if t not in schedules]
    lines = []
    for t in TARGETS:
        values = {g: (_pg(consensus, g) or {}).get("to_reach", {}).get(t) for g in p["topologies"]}
        lines.append(
            _compare(
                f"Consensus, PowerGossip r1 bits per peer to relative error {t:.0e}",
                values,
                schedules,
                statics,
                "bits",
            )
        )
    if target is not None:
        values = {}
        for g in p["topologies"]:
            row = _pg(training, g)
            values[g] = (
                None
                if row is None
                else _reach([(x, a) for x, a in row["curve"] if a is not None], target)
            )
        lines.append(
            _compare(
                f"Training, PowerGossip r1 MB per peer to averaged-model accuracy {_pct(target)}",
                values,
                schedules,
                statics,
                "MB",
            )
        )
        finals = {g: (_pg(training, g) or {}).get("acc_avg") for g in p["topologies"]}
        lines.append(
            "- Training, PowerGossip r1 final averaged-model accuracy after the same epochs: "
            + ", ".join(f"{g} {_pct(a)}" for g, a in finals.items())
            + "."
        )
        static_finals = [finals[g] for g in statics if finals.get(g) is not None]
        higher = min(static_finals) if static_finals else None
        if higher is not None and higher > target:
            # The common bar above is the weakest run's final accuracy; the static graphs' bar
            # shows whether the schedules' byte saving survives a higher accuracy.
            values = {}
            for g in p["topologies"]:
                row = _pg(training, g)
                values[g] = (
                    None
                    if row is None
                    else _reach([(x, a) for x, a in row["curve"] if a is not None], higher)
                )
            lines.append(
                _compare(
                    f"Training, the same at the static graphs' lower final accuracy {_pct(higher)}",
                    values,
                    schedules,
                    statics,
                    "MB",
                )
            )
        per_step = {g: (_pg(training, g) or {}).get("mb_per_step") for g in p["topologies"]}
        if all(per_step.values()):
            lines.append(
                "- Why: per step a schedule's peer sends to one neighbour, a ring's to 2 and a "
                "torus' to 4; PowerGossip's measured MB per step: "
                + ", ".join(f"{g} {v * 1e3:.3g} kB" for g, v in per_step.items())
                + f". Training rows are one seed and {p['epochs']} epochs, so accuracy "
                "differences of about 1 pp are within seed noise (training.md's 3-seed "
                "headline has a std of 0.6-0.9 pp on 8 peers)."
            )
    return lines


# --------------------------------------------------------------------------------------------------
# the page


def run_dynamic(
    out: Path,
    quick: bool = False,
    epochs: int = TRAINING_EPOCHS,
    command: str = "python -m experiments.suite dynamic",
) -> Path:
    """Run both sections; write dynamic.md, its CSVs, dynamic.json and the two plots under `out`."""
    started = time.perf_counter()
    p = plan(quick, epochs)
    consensus = []
    for topology, label, cspec, _ in cases(p):
        log(f"consensus {topology} {label}: {cspec}")
        consensus.append(run_consensus_case(topology, label, cspec, p))
    consensus_seconds = time.perf_counter() - started
    training = []
    for topology, label, _, tspec in cases(p):
        row = attempt(
            label,
            tspec,
            dict(
                topology=topology,
                partition="iid",
                epochs=p["epochs"],
                eval_every=max(1, p["epochs"] // 10),
                seed=0,
                # a loaded shared machine can stall a peer thread for minutes
                comm_timeout=600.0,
            ),
            quick,
        )
        if topology in p["schedules"] and row.get("gamma_text") == "topology":
            row["gamma_text"] = "1 (schedule)"  # an unset γ on a schedule is 1, not a topology's
        training.append(row)
    seconds = time.perf_counter() - started
    target = training_target(training)
    text = page(consensus, training, p, target, command, seconds, consensus_seconds)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "dynamic.md", text)
    atomic_write(out / "dynamic_consensus.csv", consensus_csv(consensus, p["budgets"]))
    atomic_write(out / "dynamic_training.csv", build_csv(training))
    atomic_write(
        out / "dynamic.json",
        json.dumps(
            {
                "command": command,
                "seconds": seconds,
                "plan": p,
                "consensus": [
                    {k: v for k, v in r.items() if k not in ("at_budget", "to_reach")}
                    for r in consensus
                ],
                "training": training,
            },
            indent=1,
            default=str,
        )
        + "\n",
    )
    try:
        plot_consensus(consensus, p, out / "dynamic_error_vs_bits.png")
        plot_training(training, p, out / "dynamic_accuracy.png")
    except Exception as exc:  # the tables matter more than the pictures
        log(f"plot failed: {exc}")
    log(f"wrote {out / 'dynamic.md'} in {seconds:.0f} s")
    return out / "dynamic.md"


def page(consensus, training, p, target, command, seconds, consensus_seconds) -> str:
    """dynamic.md from the rows of both sections."""
    data = QUICK_BASE if p["quick"] else BASE
    n = 4 if p["quick"] else 16
    text = header(
        f"Gossip on graphs that change every step, {n} peers"
        + (" (--quick)" if p["quick"] else ""),
        command,
        seconds,
        f"Running time {seconds / 60:.1f} min on 2 CPU cores shared with other jobs "
        f"(consensus {consensus_seconds / 60:.1f} min); torch threads 1.",
    )
    text += (
        "Graphs: ring and 2-D torus (static, Metropolis weights: 1/3 and 1/5, the consensus page's "
        "uniform weights on these regular graphs), one-peer exponential (at step t peer i pairs "
        "with i XOR 2^(t mod log2 n), weights 1/2: one neighbour per step, exact averaging after "
        "log2 n steps) and random matchings (a fresh seeded perfect matching per step, Metropolis "
        "weights on it); push-sum runs on the directed exponential schedule (at step t peer i "
        "pushes to i + 2^(t mod log2 n), keeping half). Exact gossip and PowerGossip use their default γ: the "
        "topology's 2/(λmin+λmax) of I−W on a static graph, 1 (plain mixing with W(t)) on a "
        "schedule. Bytes always come from the transport's counters.\n\n"
    )
    text += (
        "## The question: does PowerGossip on a one-peer schedule need fewer bytes than on a ring "
        "or torus for the same accuracy?\n\n"
        + "\n".join(verdict(consensus, training, p, target))
        + "\n\n"
    )
    text += (
        f"## Consensus: {p['problem']} per peer, N(0,1) float32 seeded 42 + rank\n\n"
        "As on the consensus page: peers only gossip; error = mean over peers of ‖x_i − x̄‖²_F, "
        "shown relative to the initial error (the same for every graph: same peers, same seeds). "
        f"A run stops after the first step past {p['max_bits']:.0e} bits per peer, after "
        f"{p['max_steps']} steps, or once its relative error is below {min(TARGETS) / 2:g}. "
        "Errors at matched bits and bits to reach a target are log-log interpolated between logged "
        'steps (every step up to 20, then at most 20 steps apart); "—" = the budget is before '
        "the first step or past the end of the run.\n\n"
        + consensus_table(consensus, p["budgets"])
        + "\n![relative error vs bits](dynamic_error_vs_bits.png)\n\n"
    )
    text += (
        f"## Training: {data['dataset']} `{data['model']}`, {n} peers, iid, {p['epochs']} epochs, seed 0\n\n"
        f"The training page's recipe and columns (training.md); {p['epochs']} epochs "
        "(evaluated every "
        f"{max(1, p['epochs'] // 10)}) is what fits the page's time budget. The "
        "projected wall time is training.md's: measured compute + rounds × latency + critical "
        "bytes ÷ bandwidth; compute was measured with "
        f"{n} peer threads on 2 shared cores, so it "
        "dominates and is noisy across rows, the bracketed communication part is deterministic. "
        "In the plot and the reach table a run's projected time at an evaluation is its total "
        "scaled by the evaluation's share of the run's bytes (each step costs the same on these "
        "graphs). The ratio column compares with exact gossip on the same graph.\n\n"
        + build_table(training)
    )
    if target is not None:
        text += (
            f"\nMB and projected seconds per peer to first reach {_pct(target)} averaged-model accuracy "
            "(the lowest final accuracy among the PowerGossip runs; linear between evaluations):\n\n"
            + reach_table(training, target)
        )
    text += (
        "\n![accuracy vs MB and vs projected time](dynamic_accuracy.png)\n\n"
        "Data: [dynamic_consensus.csv](dynamic_consensus.csv), [dynamic_training.csv](dynamic_training.csv), "
        "[dynamic.json](dynamic.json) (the consensus curves and training rows).\n"
    )
    return text
