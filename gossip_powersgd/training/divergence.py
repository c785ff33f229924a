"""When a run has diverged: `check_divergence` of every log and eval record (the trainer's)."""

from __future__ import annotations

import math
from typing import Any, Dict, List

from ..algorithms.base import NonFiniteError

__all__ = ["DIVERGENCE_FACTOR", "check_divergence"]


#: A run has diverged when a log or eval record's training loss (mean over peers) exceeds this
#: factor times ln(classes), the loss of a uniform guess, which is about where every run starts, or
#: its consensus distance exceeds it times the first recorded consensus distance (at least 1).
#: Both values are the same on every peer, so every peer stops at the same record. 1e6 is far
#: beyond what a run that still learns reaches (its loss falls below ln(classes)), and far below
#: float32's overflow, so the run stops with a clear line long before it turns into NaN.
DIVERGENCE_FACTOR = 1e6


def check_divergence(
    record: Dict[str, Any], history: List[Dict[str, Any]], num_classes: int, hint: str = ""
) -> None:
    """Raise `NonFiniteError` ("diverged") if `record` passes the `DIVERGENCE_FACTOR` limits;
    `history` (the run's records so far, checkpointed) gives the first consensus distance; `hint`
    ends the message (the DP hook's `divergence_hint`: the noise as a likely cause)."""
    loss_limit = DIVERGENCE_FACTOR * math.log(max(2, num_classes))
    # With private peer statistics (DP) no training loss is shared: the peers' test loss, a
    # function of their (private) models on the test set only, stands in at evaluations.
    which, loss = "training loss", record.get("train_loss")
    if loss is None:
        which, loss = "mean test loss of the peers' models", record.get("test_loss_mean")
    if loss is not None and loss > loss_limit:
        raise NonFiniteError(
            f"the run diverged: the {which} is {loss:.3g} at step {record['step']}, more than "
            f"{DIVERGENCE_FACTOR:g} x ln({num_classes}) (a uniform guess's loss); lower the learning "
            f"rate (or the algorithm's gamma){hint}"
        )
    first = next((r["consensus_distance"] for r in history if "consensus_distance" in r), None)
    distance = record.get("consensus_distance")
    if first is None or distance is None:
        return
    distance_limit = DIVERGENCE_FACTOR * max(1.0, first)
    if distance > distance_limit:
        raise NonFiniteError(
            f"the run diverged: the consensus distance is {distance:.3g} at step {record['step']}, "
            f"more than {DIVERGENCE_FACTOR:g} x max(1, its first value {first:.3g}); lower the "
            f"learning rate (or the algorithm's gamma){hint}"
        )
