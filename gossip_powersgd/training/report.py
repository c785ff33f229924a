"""What a finished run writes about itself: the summary and each peer's own figures.

`report` runs on every peer at the end of `trainer.train`: the run's summary (collective: means
over peers, `evaluation.run_summary`, plus each feature's `summary_fields`) goes to summary.json and
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

from ..errors import PeerLostError
from ..utils import atomic_write
from .evaluation import format_summary, peer_report, run_summary

if TYPE_CHECKING:
    from ..comm.base import Comm
    from .config import TrainConfig
    from .hooks import TrainingHooks
    from .runstate import RunState
    from .setup import PeerRun


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
