"""The bandwidth page's arithmetic, from stored rows only: steps to the target accuracy, a step's
cost three ways (`StepCosts`: measured, core each, projected, as page.md defines them), and the
time to a step (`Schedule`: its steps, a warm-up phase at the warm-up row's cost, the
evaluations up to it)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import List, Mapping, Optional, Sequence, Tuple

from experiments.suite.runs import LATENCY_S
from gossip_powersgd.cluster import parse_rate as rate_bits
from gossip_powersgd.cluster.measure import PAYLOAD_SHARE

_UNITS = ("kbit", "mbit", "gbit")


def rate_text(rate: str) -> str:
    """ "1 Gbit/s", "100 Mbit/s"."""
    for unit in _UNITS:
        if rate.endswith(unit):
            return f"{rate[: -len(unit)]} {unit[0].upper()}bit/s"
    return rate


# ---- accuracy against steps -------------------------------------------------------------------------
def first_reach(evals: Sequence[Sequence[float]], target: float) -> Optional[Tuple[int, float]]:
    """(step, training MB per peer) of the first evaluation at which the averaged model's accuracy
    is at least `target`; None if none is. `evals`: [step, accuracy, MB] in order."""
    for step, accuracy, mb in evals:
        if accuracy >= target - 1e-12:
            return int(step), float(mb)
    return None


def evaluations_until(evals: Sequence[Sequence[float]], step: int) -> int:
    """How many evaluations were made up to and including step `step`."""
    return sum(1 for e in evals if e[0] <= step)


def common_target(peaks: Sequence[float]) -> float:
    """The highest whole percent every one of the runs reaches at some evaluation (`peaks`:
    each run's best averaged-model accuracy)."""
    return math.floor(100 * min(peaks) + 1e-9) / 100


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> List[Tuple[int, float]]:
    """(step, mean accuracy over seeds) at every evaluation all `curves` share."""
    shared = min(len(c) for c in curves)
    out = []
    for i in range(shared):
        steps = {int(c[i][0]) for c in curves}
        if len(steps) != 1:
            raise ValueError(f"the seeds evaluated at different steps: {sorted(steps)}")
        out.append((steps.pop(), statistics.fmean(c[i][1] for c in curves)))
    return out


# ---- a step's cost ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Seconds per step of one algorithm at one rate, three ways, and what they are made of."""

    measured: float  #: the slowest host's mean step on the cluster
    core_each: float
    projected: float
    measured_median: float  #: the slowest host's median step there
    cpu_alone: float  #: CPU seconds of one peer's step alone: compute and arithmetic (one core)
    arith_alone: float  #: the algorithm's own arithmetic, alone (wall)
    compute_shared: float  #: compute on the cluster (the median host, wall), cores shared
    arith_shared: float  #: the algorithm's arithmetic there (wall)
    cpu_shared: float  #: the CPU time of a step there (the median host; gloo's threads too)
    comm_in_training: float  #: time inside the transport during training (median host)
    comm_replayed: float  #: communication with compute out of the way (slowest host)
    comm_projected: float  #: the project's projected communication
    comm_egress: float  #: every byte a host sends through its one link, at its payload rate
    bytes_sent: float  #: training bytes a host sends per step (the most of any host)
    rounds: float  #: sequential message rounds per step (the most of any host)


def step_costs(timing: Mapping, alone: Mapping, rate: str) -> StepCosts:
    """The costs of one algorithm from its timing row's entry (`timing`: per-host lists) and its
    alone row, at link rate `rate` (the slowest link where one host is slowed: `rate` is then
    the rate the projection assumes for every host)."""
    bits = rate_bits(rate)
    rounds = max(timing["rounds"])
    critical = max(timing["critical_bytes"])
    projected_comm = rounds * LATENCY_S + critical * 8 / bits
    replayed = statistics.median(timing["replay"])
    fixed = alone["cpu"]
    return StepCosts(
        measured=max(timing["wall_mean"]),
        core_each=fixed + replayed,
        projected=fixed + projected_comm,
        measured_median=max(timing["wall"]),
        cpu_alone=fixed,
        arith_alone=alone["arith"],
        compute_shared=statistics.median(timing["compute"]),
        arith_shared=statistics.median(timing["arith"]),
        cpu_shared=statistics.median(timing["cpu"]),
        comm_in_training=statistics.median(timing["comm"]),
        comm_replayed=replayed,
        comm_projected=projected_comm,
        comm_egress=max(timing["bytes_sent"]) * 8 / (bits * PAYLOAD_SHARE),
        bytes_sent=max(timing["bytes_sent"]),
        rounds=rounds,
    )


@dataclasses.dataclass(frozen=True)
class EvalCosts:
    measured: float  #: the slowest host's evaluation on the cluster
    core_each: float  #: one peer's evaluation alone (CPU time) + its communication replayed
    metric_bytes: float  #: bytes a host sends per evaluation (the most of any host)


def eval_costs(timing: Mapping, alone: Mapping) -> EvalCosts:
    e = timing["eval"]
    return EvalCosts(
        measured=max(e["seconds"]),
        core_each=alone["eval_cpu"] + statistics.median(e["replay"]),
        metric_bytes=max(e["metric_bytes"]),
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


def seconds_text(seconds: Optional[float]) -> str:
    """A duration as a reader takes it in: 0.84 s, 12.3 s, 41 min, 5.2 h, 3.1 d."""
    if seconds is None:
        return "not reached"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def per_seed_times(
    curves: Sequence[Sequence[Sequence[float]]], target: float, schedule: Schedule
) -> List[Optional[float]]:
    """Seconds to `target` per seed (steps and evaluations up to the first evaluation that
    reaches it), None for a seed that never does."""
    out = []
    for evals in curves:
        hit = first_reach(evals, target)
        out.append(
            None if hit is None else schedule.until(hit[0], evaluations_until(evals, hit[0]))
        )
    return out
