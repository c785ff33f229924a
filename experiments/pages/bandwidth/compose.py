"""The bandwidth page's arithmetic, from stored rows only: steps to the target accuracy, a step's
cost three ways (measured, core each, projected: page.md defines them) and the time to a step
(`Schedule`)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from experiments.suite.runs import LATENCY_S
from gossip_powersgd.cluster import parse_rate as rate_bits
from gossip_powersgd.cluster.measure import PAYLOAD_SHARE


def rate_text(rate: str) -> str:
    """ "1 Gbit/s", "100 Mbit/s"."""
    for unit in ("kbit", "mbit", "gbit"):
        if rate.endswith(unit):
            return f"{rate[: -len(unit)]} {unit[0].upper()}bit/s"
    return rate


def seconds_text(seconds: Optional[float]) -> str:
    """A duration as a reader takes it in: 0.84 s, 12.3 s, 41 min, 5.2 h, 3.1 d."""
    if seconds is None:
        return "not reached"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def first_reach(evals: Sequence[Sequence[float]], target: float) -> Optional[Tuple[int, float]]:
    """(step, training MB per peer) of the first evaluation ([step, accuracy, MB]) at which the
    averaged model's accuracy is at least `target`; None if none is."""
    for step, accuracy, mb in evals:
        if accuracy >= target - 1e-12:
            return int(step), float(mb)
    return None


def evaluations_until(evals: Sequence[Sequence[float]], step: int) -> int:
    """How many evaluations were made up to and including step `step`."""
    return sum(1 for e in evals if e[0] <= step)


def common_target(peaks: Sequence[float]) -> float:
    """The highest whole percent every run reaches (`peaks`: each run's best accuracy)."""
    return math.floor(100 * min(peaks) + 1e-9) / 100


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> List[Tuple[int, float]]:
    """(step, mean accuracy over seeds) at every evaluation all `curves` share."""
    out = []
    for points in zip(*curves):
        steps = {int(p[0]) for p in points}
        if len(steps) != 1:
            raise ValueError(f"the seeds evaluated at different steps: {sorted(steps)}")
        out.append((steps.pop(), statistics.fmean(p[1] for p in points)))
    return out


def step_costs(timing: Mapping, alone: Mapping, rate: str) -> Dict[str, float]:
    """Seconds per step of one algorithm at link rate `rate` (with a host slowed: the rate the
    projection assumes for every host), from its timing row's entry (per-host lists) and its
    alone row: the three figures (measured: the slowest host's mean step; core each; projected)
    and their parts: the slowest host's median step; one peer's step alone (CPU; the
    arithmetic's wall); the median host's compute, arithmetic, CPU and time in the transport on
    the cluster; the communication replayed (slowest host), projected, and by the egress model
    (every byte through the host's one link at its payload rate); bytes and rounds per step."""
    bits, median = rate_bits(rate), statistics.median
    rounds, replayed, fixed = max(timing["rounds"]), median(timing["replay"]), alone["cpu"]
    projected_comm = rounds * LATENCY_S + max(timing["critical_bytes"]) * 8 / bits
    return dict(
        measured=max(timing["wall_mean"]),
        core_each=fixed + replayed,
        projected=fixed + projected_comm,
        measured_median=max(timing["wall"]),
        cpu_alone=fixed,
        arith_alone=alone["arith"],
        compute_shared=median(timing["compute"]),
        arith_shared=median(timing["arith"]),
        cpu_shared=median(timing["cpu"]),
        comm_in_training=median(timing["comm"]),
        comm_replayed=replayed,
        comm_projected=projected_comm,
        comm_egress=max(timing["bytes_sent"]) * 8 / (bits * PAYLOAD_SHARE),
        bytes_sent=max(timing["bytes_sent"]),
        rounds=rounds,
    )


def eval_costs(timing: Mapping, alone: Mapping) -> Dict[str, Any]:
    """An evaluation: the slowest host's on the cluster (measured); one peer's alone (CPU) plus
    its communication replayed (core each); the most bytes a host sends (metric_bytes)."""
    e = timing["eval"]
    core_each = alone["eval_cpu"] + statistics.median(e["replay"])
    return dict(
        measured=max(e["seconds"]), core_each=core_each, metric_bytes=max(e["metric_bytes"])
    )


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What a run's steps cost: `per_step` seconds each, except the first `warm_steps`, which
    cost `warm_per_step` each; every evaluation `per_eval`."""

    per_step: float
    warm_steps: int = 0
    warm_per_step: float = 0.0
    per_eval: float = 0.0

    def training(self, steps: int) -> float:
        """Seconds of the first `steps` steps, evaluations left out."""
        warm = min(steps, self.warm_steps)
        return warm * self.warm_per_step + (steps - warm) * self.per_step

    def until(self, steps: int, evaluations: int) -> float:
        """Seconds of the first `steps` steps and `evaluations` evaluations."""
        return self.training(steps) + evaluations * self.per_eval


def per_seed_times(curves, target: float, schedule: Schedule) -> List[Optional[float]]:
    """Seconds to `target` per seed (steps and evaluations up to the first evaluation that
    reaches it), None for a seed that never does."""
    hits = [(first_reach(evals, target), evals) for evals in curves]
    return [
        None if h is None else schedule.until(h[0], evaluations_until(e, h[0])) for h, e in hits
    ]
