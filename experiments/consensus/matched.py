"""Comparing consensus curves at matched bits: error at a given number of bits, and bits to reach
a given relative error, both log-log interpolated between the logged steps around the point.

A budget column that takes each algorithm's last logged step within the budget compares algorithms
at different bit counts (their steps cost different bits); these functions compare them at the same
bits instead. A curve is a list of records with "bits_per_peer" and "error", in step order.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence


def _loglog(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    """y at x on the straight line through (x0, y0), (x1, y1) in log-log coordinates."""
    if x1 == x0:
        return y1
    t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


def positive_points(history: Sequence[Dict]) -> List[Dict]:
    """The records of a curve that can be placed on log-log axes (positive, finite)."""
    return [
        r
        for r in history
        if r["bits_per_peer"] > 0 and r["error"] > 0 and math.isfinite(r["error"])
    ]


def error_at_bits(history: Sequence[Dict], bits: float) -> Optional[float]:
    """The error at `bits` per peer, log-log interpolated between the logged steps around it;
    None when `bits` is before the first step's or after the last logged step's bits."""
    rows = positive_points(history)
    if not rows or bits < rows[0]["bits_per_peer"] or bits > rows[-1]["bits_per_peer"]:
        return None
    for before, after in zip(rows, rows[1:]):
        if before["bits_per_peer"] <= bits <= after["bits_per_peer"]:
            return _loglog(
                before["bits_per_peer"],
                before["error"],
                after["bits_per_peer"],
                after["error"],
                bits,
            )
    return rows[0]["error"]  # a single logged step, exactly at `bits`


def bits_to_reach(history: Sequence[Dict], relative: float) -> Optional[float]:
    """Bits per peer at which the error first falls to `relative` x the initial error, log-log
    interpolated between the logged steps around the crossing; None if the run never got there."""
    target = relative * history[0]["error"]
    rows = positive_points(history)
    for k, row in enumerate(rows):
        if row["error"] <= target:
            if k == 0:
                return row["bits_per_peer"]
            before = rows[k - 1]
            return _loglog(
                before["error"], before["bits_per_peer"], row["error"], row["bits_per_peer"], target
            )
    return None


__all__ = ["error_at_bits", "bits_to_reach", "positive_points"]
