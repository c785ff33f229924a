"""What a finished run writes about itself: the summary and each peer's own figures.

`report` runs on every peer at the end of `trainer.train`: the run's summary (collective: means
over peers, `run_summary` below, plus each feature's `summary_fields`) goes to summary.json and
summary.md, written by rank 0 (the lowest member after churn); each peer's own figures (its shard
size, label histogram, last training loss, and under differential privacy its sampling rate, sigma
and epsilons: `peer_fields`) go to its own ``peers/rank-K.json`` and ``peers/rank-K.md``, written by
that peer and sent to no other. `format_peer_report` is that peer's table: the one place a peer's
own epsilon is shown as a table when the peers' statistics are private.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import PeerLostError
from ..metrics import mean_active_degree
from ..utils import atomic_write
from .evaluation import model_digest
from .features import summary_rows

if TYPE_CHECKING:
    from ..comm.base import Comm
    from .config import TrainConfig
    from .hooks import TrainingHooks
    from .runstate import RunState
    from .setup import PeerRun


# ---- the summary -----------------------------------------------------------------------------------


def run_summary(
    comm: Comm,
    config,
    history,
    histogram,
    num_parameters,
    parameter_bytes,
    algorithm,
    model,
    step,
    steps_per_epoch,
    timers,
    private: bool = False,
    eval_split: str = "test",
    churn=None,
) -> Dict[str, Any]:
    """What `summary.json` holds (collective; the same dict on every peer).

    `eval_split` names the data the figures were evaluated on ("test", or "valid" for
    `wikitext2:split=valid`): the `*_test_*` keys hold that split's figures, and the table says so.

    The final metrics are the last eval record's; traffic and timers are means over peers, the wall
    time the slowest peer's; `model_sha256` lists every peer's model digest in rank order.
    `private`: no label histogram and no training loss (`peer_statistics` says where they are).
    `churn`: the run's `ChurnRun` (on_peer_loss: continue), for the exact-gossip baseline of a
    membership that changed (`_exact_gossip`).
    """
    evals = [r for r in history if r.get("kind") == "eval"]
    final = evals[-1] if evals else {}
    released = _released_statistics(comm, histogram, private)
    means, wall = _traffic_and_time(comm, timers)
    digests = [d.hex() for d in comm.allgather_bytes(bytes.fromhex(model_digest(model)))]
    local_steps = getattr(config, "local_steps", 1)
    every = local_steps if algorithm.acts_on == "parameters" else 1  # steps per gossip round
    rounds = step // every
    exact_bytes, formula = _exact_gossip(comm, parameter_bytes, rounds, every, churn)
    sent = float(means[0])
    return {
        "algorithm": config.algorithm,
        "topology": config.topology,
        "peers": comm.size,
        "dataset": config.dataset,
        "partition": config.partition,
        "model": config.model,
        "optimizer": config.optimizer,
        "epochs": config.epochs,
        "epochs_done": final.get("epoch", 0),
        "steps": step,
        "steps_per_epoch": steps_per_epoch,
        "parameters": num_parameters,
        **_final_figures(final, eval_split),
        "mb_sent_per_peer": sent / 1e6,
        "messages_sent_per_peer": float(means[1]),
        "exact_gossip_mb_per_peer_formula": exact_bytes / 1e6,
        "exact_gossip_formula": formula,
        "local_steps": local_steps,
        "communication_rounds": rounds,
        "compression_ratio": (exact_bytes / sent) if sent > 0 else None,
        "bytes_per_step": int(algorithm.bytes_per_step()),
        "wall_time_s": wall,
        "time_compute_s": float(means[2]),
        "time_gossip_compute_s": float(means[3]),
        "time_communication_s": float(means[4]),
        **released,
        "model_sha256": digests,
        "run_dir": config.out_dir,
    }


def _exact_gossip(comm: Comm, parameter_bytes, rounds, every, churn) -> Tuple[float, str]:
    """(the bytes per peer that exact gossip would have sent, the words saying how they are
    counted): a formula, not measured. The membership never changed: model bytes x the mean degree
    of the graph (each round's, on a schedule) x the communication rounds. It changed (churn):
    each member counts, per round its traffic counters cover and it was a member in, model bytes x
    its neighbours in the graph in force then, none in a round whose gossip a lost peer
    interrupted on it (its unfinished exchanges counted no byte sent; `ChurnRun.exact_messages`);
    the mean over the members at the end, the peers and rounds mb_sent_per_peer covers
    (collective)."""
    messages = None if churn is None else churn.exact_messages(rounds, every)
    if messages is None:
        degree = mean_active_degree(comm.topology, rounds)  # per round's graph on a schedule
        words = f"model bytes {parameter_bytes} x mean degree {degree:g} x communication rounds"
        return parameter_bytes * degree * rounds, f"{words} {rounds} (formula, not measured)"
    mean = torch.tensor([float(parameter_bytes * messages)], dtype=torch.float64)
    comm.allreduce_(mean, op="mean", metric=True)
    # (where peers are found lost, a restarted process's counters count from its admission, and
    # a round a loss interrupted counts neither in them nor here)
    rejoined = (
        " (a peer restarted with --rejoin: from its admission; a round whose gossip a lost peer "
        "interrupted counts none)"
        if churn.detected is not None
        else ""
    )
    return float(mean[0]), (
        f"model bytes {parameter_bytes} x each member's neighbours in the graph in force at each "
        f"of the {rounds} communication rounds it took part in{rejoined}, mean over the "
        f"{len(churn.peer.epoch.live)} members at the end (the peers and rounds of "
        "mb_sent_per_peer; formula, not measured)"
    )


def _released_statistics(comm: Comm, histogram, private: bool) -> Dict[str, Any]:
    """What the summary says of the peers' own data: every peer's label histogram (summed over
    peers, collective), or under `private` only where each peer's own figures are."""
    if private:
        return {
            "peer_statistics": (
                "private: each peer's shard size, label histogram and "
                "training loss are in its own peers/rank-K.json"
            )
        }
    # The last column says who took part: under on_peer_loss: continue a peer that is not a
    # member at the end does not, and its row is null (its own file has it), not zeros.
    hist = torch.zeros(comm.size, len(histogram) + 1, dtype=torch.float64)
    hist[comm.rank] = torch.tensor([*histogram, 1.0], dtype=torch.float64)
    comm.allreduce_(hist, op="sum", metric=True)
    rows = [[int(v) for v in row[:-1]] if row[-1] else None for row in hist.tolist()]
    return {"label_histogram": rows}


def _traffic_and_time(comm: Comm, timers) -> Tuple[torch.Tensor, float]:
    """(the means over peers of bytes sent, messages sent, compute, gossip compute and
    communication time; the slowest peer's wall time), collective."""
    means = comm.allreduce_(
        torch.tensor(
            [
                comm.stats.bytes_sent,
                comm.stats.messages_sent,
                timers["time_compute"],
                timers["time_gossip_compute"],
                timers["time_communication"],
            ],
            dtype=torch.float64,
        ),
        op="mean",
        metric=True,
    )
    wall = torch.tensor([timers["wall_time"]], dtype=torch.float64)
    comm.allreduce_(wall, op="max", metric=True)
    return means, float(wall[0])


def _final_figures(final: Dict[str, Any], eval_split: str) -> Dict[str, Any]:
    """The last evaluation's figures, as the summary names them (`eval_split`: the data they were
    evaluated on)."""
    return {
        "final_test_acc_avg_model": final.get("test_acc_avg_model"),
        "final_test_acc_local_mean": final.get("test_acc_mean"),
        "final_test_acc_local_min": final.get("test_acc_min"),
        "final_test_acc_local_max": final.get("test_acc_max"),
        "eval_split": eval_split,
        **(
            {"final_test_perplexity_avg_model": final["test_perplexity_avg_model"]}
            if "test_perplexity_avg_model" in final
            else {}
        ),
        "final_train_loss": final.get("train_loss"),
        "final_consensus_distance": final.get("consensus_distance"),
    }


def _fmt(value, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    if pct:
        return f"{100 * value:.2f} %"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _summary_rows(summary: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The summary's own (quantity, value) rows, before the features' rows."""
    split = summary.get("eval_split", "test")
    perplexity = summary.get("final_test_perplexity_avg_model")
    return [
        ("algorithm", summary["algorithm"]),
        ("topology", f"{summary['topology']} ({summary['peers']} peers)"),
        (
            "data / model",
            f"{summary['dataset']} ({summary['partition']}) / {summary['model']}, "
            f"{summary['parameters']} parameters",
        ),
        ("epochs / steps", f"{summary['epochs_done']} / {summary['steps']}"),
        (f"averaged-model {split} accuracy", _fmt(summary["final_test_acc_avg_model"], pct=True)),
        *(
            [(f"averaged-model {split} perplexity", _fmt(perplexity))]
            if perplexity is not None
            else []
        ),
        (
            f"local {split} accuracy mean [min, max]",
            f"{_fmt(summary['final_test_acc_local_mean'], True)} "
            f"[{_fmt(summary['final_test_acc_local_min'], True)}, "
            f"{_fmt(summary['final_test_acc_local_max'], True)}]",
        ),
        (
            "training loss (mean over peers)",
            _fmt(summary["final_train_loss"])
            if "label_histogram" in summary
            else "private (each peer's own file)",
        ),
        ("consensus distance", _fmt(summary["final_consensus_distance"])),
        ("training MB sent per peer", f"{summary['mb_sent_per_peer']:.3f}"),
        (
            "exact gossip MB per peer (formula)",
            f"{summary['exact_gossip_mb_per_peer_formula']:.3f} = {summary['exact_gossip_formula']}",
        ),
        (
            "exact gossip formula / sent",
            "n/a"
            if summary["compression_ratio"] is None
            else f"{summary['compression_ratio']:.1f}x",
        ),
        (
            "wall time",
            f"{summary['wall_time_s']:.1f} s (compute {summary['time_compute_s']:.1f} s, "
            f"gossip compute {summary['time_gossip_compute_s']:.1f} s, communication "
            f"{summary['time_communication_s']:.1f} s, means over peers)",
        ),
    ]


def _table_lines(rows: Sequence[Tuple[str, str]], markdown: bool) -> List[str]:
    """The rows as a markdown table under its title, or as aligned text."""
    if markdown:
        return ["# Run summary", "", "| quantity | value |", "|---|---|"] + [
            f"| {k} | {v} |" for k, v in rows
        ]
    width = max(len(k) for k, _ in rows)
    return [f"{k.ljust(width)}  {v}" for k, v in rows]


_ABSENT_ROW = "not a member at the end: in its own peers/rank-K.json"


def _histogram_lines(hist: List[Optional[List[int]]], markdown: bool) -> List[str]:
    """Every peer's label histogram, as a markdown section or as aligned text (a null row: a
    peer that was not a member at the end, `_released_statistics`)."""
    classes = len(next(row for row in hist if row is not None))
    if markdown:
        return [
            "",
            "## Label histogram per peer",
            "",
            "| peer | " + " | ".join(str(c) for c in range(classes)) + " |",
            "|---" * (classes + 1) + "|",
        ] + [
            f"| {k} | " + (_ABSENT_ROW if row is None else " | ".join(map(str, row))) + " |"
            for k, row in enumerate(hist)
        ]
    return [f"label histogram per peer (classes 0..{classes - 1}):"] + [
        f"  peer {k:>3}: " + (_ABSENT_ROW if row is None else " ".join(f"{v:>4}" for v in row))
        for k, row in enumerate(hist)
    ]


def format_summary(summary: Dict[str, Any], markdown: bool = False) -> str:
    """The summary as a table (markdown for summary.md, aligned text for the terminal)."""
    rows = _summary_rows(summary)
    rows += summary_rows(summary)  # each feature's (differential privacy, observers, ...)
    hist = summary.get("label_histogram")
    # a language model has a target per token: its histogram would be vocabulary-wide (empty rows)
    if hist is not None and not any(row for row in hist if row):
        rows.append(("label histogram", "none (a language model's targets are tokens)"))
        hist = None
    elif hist is None:  # private peer statistics: nothing of any peer's own data to show
        rows.append(("peer statistics", summary.get("peer_statistics", "n/a")))
    lines = _table_lines(rows, markdown)
    if hist is not None:
        lines += _histogram_lines(hist, markdown)
    return "\n".join(lines) + ("\n" if markdown else "")


def peer_report(comm: Comm, history, histogram, shard_size: int) -> Dict[str, Any]:
    """This peer's own figures, for its own `RUN_DIR/peers/rank-K.json` only (not collective):
    its shard size, label histogram and last training loss (the privacy hook adds its epsilons)."""
    evals = [r for r in history if r.get("kind") == "eval"]
    return {
        "rank": comm.rank,
        "shard_size": int(shard_size),
        "label_histogram": [int(v) for v in histogram],
        "final_train_loss_local": evals[-1].get("train_loss_local") if evals else None,
    }


# ---- writing it -----------------------------------------------------------------------------------


def report(
    comm: Comm,
    config: TrainConfig,
    run_dir: Optional[Path],
    run: PeerRun,
    state: RunState,
    reporting: Sequence[TrainingHooks],
    churn,
    origin: Dict[str, Any],
    private: bool,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(summary, peer): the run's summary (collective) and this peer's own figures, written as the
    module docstring says (nothing is written without a run directory)."""
    algorithm, model = run.algorithm, run.model
    member = churn is None or churn.live  # a peer away at the end writes its own file only
    summary = {"departed": True}
    if member:
        summary = run_summary(
            comm,
            config,
            state.history,
            run.histogram,
            run.num_parameters,
            run.parameter_bytes,
            algorithm,
            model,
            state.step,
            run.steps_per_epoch,
            state.timers(algorithm),
            private=private,
            eval_split=run.eval_split,
            churn=churn,
        )
    peer = peer_report(comm, state.history, run.histogram, len(run.batches.x))
    for hook in reporting:
        if member:
            summary.update(getattr(hook, "summary_fields", dict)())
        peer.update(getattr(hook, "peer_fields", dict)())
    if run_dir is not None:  # each peer's own figures, in its own files
        own = run_dir / "peers" / f"rank-{comm.rank}"
        atomic_write(own.with_suffix(".json"), json.dumps(peer, indent=2) + "\n")
        atomic_write(own.with_suffix(".md"), format_peer_report(peer))
    summary["provenance"] = origin
    if member and comm.rank == (churn.leader if churn else 0) and run_dir is not None:
        atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        atomic_write(run_dir / "summary.md", format_summary(summary, markdown=True))
    return summary, peer


def report_and_finish(comm: Comm, config, run_dir, run, state, reporting, churn, *args):
    """`report`, then with churn the end-of-run barrier (every peer, member or not, until all
    are done: the run's lock stays). On torch under on_peer_loss: continue, a peer lost during
    either one makes the members agree on going on without it (`ChurnRun.settle`) and do both
    again over the new membership (the summary is rewritten whole, by the new leader)."""
    while True:
        try:
            made = report(comm, config, run_dir, run, state, reporting, churn, *args)
            if churn is not None:
                churn.finish()
            return made
        except PeerLostError:
            if churn is None or not churn.settle(state):
                raise


#: The rows of a peer's own table: (key in peers/rank-K.json, label, format).
PEER_ROWS = (
    ("shard_size", "training samples (its shard)", "{}"),
    ("final_train_loss_local", "training loss at the last evaluation", "{:.4g}"),
    ("epsilon", "DP ε at δ (the run's accountant)", "{:.4g}"),
    ("epsilon_pld", "DP ε at δ (PLD, dp-accounting)", "{:.4g}"),
    ("epsilon_replace_one", "DP ε at δ, replace-one (PLD)", "{:.4g}"),
    ("delta", "DP δ", "{:g}"),
    ("sample_rate", "DP sampling rate q", "{:.4g}"),
    ("noise_multiplier", "DP noise multiplier σ", "{:.4g}"),
    ("steps", "DP steps accounted", "{}"),
    ("dp_accountant", "DP accountant", "{}"),
    ("dp_adjacency", "DP adjacency", "{}"),
    ("dp_randomness_note", "DP randomness", "{}"),
)
#: Keys of peers/rank-K.json the table leaves out (shown otherwise, or a note's short form).
_NOT_ROWS = {"rank", "label_histogram", "dp_randomness", "epsilon_labels"}


def _cell(value: Any, form: str) -> str:
    if value is None:
        return "n/a"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "∞ (no noise)"
    try:
        return form.format(value)
    except (ValueError, TypeError):
        return str(value)


def format_peer_report(peer: Dict[str, Any]) -> str:
    """This peer's own figures (peers/rank-K.json) as the markdown of peers/rank-K.md. An epsilon
    is labelled as the run labels it (``epsilon_labels``) where it does; a figure a feature adds
    that the table does not know is shown under its key."""
    labels = peer.get("epsilon_labels") or {}
    rows: List[Tuple[str, str]] = []
    for key, label, form in PEER_ROWS:
        if key in peer:
            rows.append((f"{labels[key]} at δ" if key in labels else label, _cell(peer[key], form)))
    known = {key for key, _, _ in PEER_ROWS} | _NOT_ROWS
    rows += [(key, _cell(value, "{}")) for key, value in peer.items() if key not in known]
    histogram = peer.get("label_histogram")
    if histogram:
        rows.append(("label histogram (classes 0..)", " ".join(str(int(v)) for v in histogram)))
    lines = [
        f"# Peer {peer.get('rank', '?')}: its own figures",
        "",
        "Written by this peer alone: none of these figures is sent to another peer.",
        "",
        "| quantity | value |",
        "|---|---|",
    ]
    return "\n".join(lines + [f"| {k} | {v} |" for k, v in rows]) + "\n"


__all__ = ["report", "report_and_finish", "format_peer_report", "PEER_ROWS"]
