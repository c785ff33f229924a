"""Monitoring quantities. Their all-reduces are metric traffic, never charged to an algorithm.

Besides the consensus distance of a model: an averaging algorithm's consensus curve (its error
against the bits each peer sent, step by step: `consensus_curve`) and the comparison at matched
bits (`error_at_bits`, `bits_to_reach`: log-log interpolated between the recorded steps)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import torch

from .algorithms.base import ParamsLike, named_tensors

if TYPE_CHECKING:
    from topologies import Topology
    from .comm.base import Comm


def _flat64(params: ParamsLike) -> torch.Tensor:
    _, tensors = named_tensors(params)
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def consensus_distance(params: ParamsLike, comm: Comm) -> float:
    """Mean over peers of ||x_i - x_bar||^2, summed over all tensors (computed in float64).

    Collective: every peer must call it, and every peer gets the same value. Traffic (metric
    counters): one ring all-reduce of the float64 parameters for x_bar, 2(n-1)/n x 8 bytes per
    parameter per peer, then one of the single scalar ||x_i - x_bar||^2. The centred form needs
    x_bar on every peer; the cheaper-looking mean ||x_i||^2 - ||x_bar||^2 (x_bar known chunk-wise
    after a reduce-scatter only) loses every digit once the peers are close, which is the regime
    this metric is for.
    """
    x = _flat64(params)
    mean = comm.allreduce_(x.clone(), op="mean", metric=True)
    local = torch.sum((x - mean) ** 2).reshape(1)
    comm.allreduce_(local, op="mean", metric=True)
    return float(local.item())


def parameter_average(params: ParamsLike, comm: Comm) -> torch.Tensor:
    """The average over peers of the flattened parameters, in float64 (collective, metric traffic)."""
    return comm.allreduce_(_flat64(params), op="mean", metric=True)


def _step_degrees(graph) -> int:
    """Sum over peers of the peers each sends to in one step's graph."""
    if graph.is_directed:
        return sum(graph.out_degrees)
    return sum(len(graph.neighbors(i)) for i in range(graph.size))


def mean_active_degree(topology: Topology, steps: int) -> float:
    """Mean over peers and over steps 0..steps-1 of the neighbours a peer sends to in that step.

    A static topology's mean degree (whatever `steps`); on a schedule the degree of each step's
    graph, not of the union (so per-step traffic formulas stay honest); on a directed graph the
    out-degree. A periodic schedule is summed over one period and its remainder.
    """
    if topology.period == 1 or steps <= 0:
        return _step_degrees(topology.at(0)) / topology.size
    period = topology.period
    counted = min(steps, period) if period else steps
    per_step = [_step_degrees(topology.at(t)) for t in range(counted)]
    if period and steps > period:
        full, rest = divmod(steps, period)
        total = full * sum(per_step) + sum(per_step[:rest])
    else:
        total = sum(per_step)
    return total / (topology.size * steps)


# ---- an averaging algorithm's consensus curve -----------------------------------------------------
#: The precision floor of a state in dtype d: FLOOR_ULPS x eps(d)^2 x mean_i ||x_i||^2 (about one
#: rounding error per entry of the state and of each of its copies, squared). Values <=
#: FLOOR_MARGIN x the floor are "at precision floor", and a curve may stop there ("floor").
FLOOR_ULPS, FLOOR_MARGIN = 100.0, 10.0
#: A curve stops as diverged once its error exceeds this multiple of the initial error.
DIVERGE_FACTOR = 1e4


def eval_steps(max_steps: int, dense: int = 20, ratio: float = 1.06, max_gap: int = 20) -> set:
    """Steps at which the error is recorded (besides budget boundaries and the last step):
    every step up to `dense`, then a geometric grid with gaps of at most `max_gap` steps."""
    steps, value = set(range(0, min(dense, max_steps) + 1)), float(dense)
    while value < max_steps:
        value = min(value * ratio, value + max_gap)
        steps.add(min(int(round(value)), max_steps))
    return steps


def _regular(comm: Comm) -> bool:
    """Every peer of a static undirected graph has the same degree (so sends as much per step)."""
    topology = comm.topology
    if not comm.is_static or topology.is_directed:
        return False
    return len({len(topology.neighbors(i)) for i in range(topology.size)}) == 1


def precision_floor(mean_norm2: float, dtype) -> float:
    """The error below which a state in `dtype` cannot average further (see FLOOR_ULPS)."""
    return FLOOR_ULPS * torch.finfo(dtype).eps ** 2 * mean_norm2


def consensus_curve(
    comm: Comm,
    spec: str,
    tensors: List[torch.Tensor],
    max_steps: int,
    max_bits: float,
    budgets: Sequence[float] = (),
    stop_error: Optional[float] = None,
    stop_at_floor: bool = False,
) -> Dict:
    """Average `tensors` (this peer's) with algorithm `spec` (collective): {"history": [{"step",
    "bits_per_peer", "error"}, ...] (the same on every peer; error: `consensus_distance`), "stop",
    "floor", "norm2" (mean_i ||x_i||^2), "seconds", "bytes_sent"}.

    Bits per peer are 8 x the transport's count of bytes sent. The run stops after the first step
    beyond `max_bits`, after `max_steps`, once the error is not finite or above DIVERGE_FACTOR x
    the initial error ("diverged"), with `stop_at_floor` within FLOOR_MARGIN of the precision
    floor ("floor"), with `stop_error` at that relative error ("reached"). Around every budget the
    last step within it and the first beyond it are recorded (interpolation brackets)."""
    from .algorithms import make_algorithm

    start = time.perf_counter()
    algorithm, regular = make_algorithm(spec, tensors, comm), _regular(comm)
    bytes0 = comm.stats.bytes_sent

    def mean(value: float, op: str = "mean") -> float:
        return float(
            comm.allreduce_(torch.tensor([value], dtype=torch.float64), op=op, metric=True)
        )

    def bits_now() -> float:
        own = float(8 * (comm.stats.bytes_sent - bytes0))
        return own if regular else mean(own)  # same algorithm, same degree: the same bytes

    schedule, ordered = eval_steps(max_steps), sorted(float(b) for b in budgets)
    error0 = consensus_distance(tensors, comm)
    norm2 = mean(sum(float(t.double().square().sum()) for t in tensors))
    floor = precision_floor(norm2, tensors[0].dtype)
    history = [{"step": 0, "bits_per_peer": 0.0, "error": error0}]
    previous = [t.detach().clone() for t in tensors]
    previous_bits, stop = 0.0, "max_steps"
    for step in range(1, max_steps + 1):
        for saved, t in zip(previous, tensors):
            saved.copy_(t)
        algorithm.step()
        bits = bits_now()
        crossed = any(previous_bits <= b < bits for b in ordered)
        if crossed and step > 1 and history[-1]["step"] != step - 1:  # the last step within it
            error = consensus_distance(previous, comm)
            history.append({"step": step - 1, "bits_per_peer": previous_bits, "error": error})
        if step in schedule or step == max_steps or bits > max_bits or crossed:
            error = consensus_distance(tensors, comm)
            history.append({"step": step, "bits_per_peer": bits, "error": error})
            diverged = not math.isfinite(error) or error > DIVERGE_FACTOR * error0
            at_floor = stop_at_floor and error <= FLOOR_MARGIN * floor
            reached = stop_error is not None and error <= stop_error * error0
            if diverged or at_floor or reached:
                stop = "diverged" if diverged else "floor" if at_floor else "reached"
                break
        if bits > max_bits:
            stop = "max_bits"
            break
        previous_bits = bits
    if regular and comm.size > 1:  # check the shortcut: every peer counted the same bytes
        low, high = (mean(float(comm.stats.bytes_sent - bytes0), op) for op in ("min", "max"))
        if low != high:
            raise RuntimeError(
                f"{spec}: peers of a regular topology sent {low:.0f} .. {high:.0f} bytes"
            )
    out = dict(history=history, stop=stop, floor=floor, norm2=norm2)
    return dict(out, seconds=time.perf_counter() - start, bytes_sent=comm.stats.bytes_sent - bytes0)


def _loglog(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    """y at x on the straight line through (x0, y0), (x1, y1) in log-log coordinates."""
    if x1 == x0:
        return y1
    t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


def positive_points(history: Sequence[Dict]) -> List[Dict]:
    """The records of a curve that can be placed on log-log axes (positive, finite)."""
    return [r for r in history if r["bits_per_peer"] > 0 and 0 < r["error"] < math.inf]


def _logged_points(history: Sequence[Dict]) -> List[Dict]:
    """The records after step 0 with a finite error, exact consensus (error 0) included."""
    return [r for r in history if r["bits_per_peer"] > 0 and 0 <= r["error"] < math.inf]


def error_at_bits(history: Sequence[Dict], bits: float) -> Optional[float]:
    """The error at `bits` per peer, log-log interpolated between the logged steps around it;
    None when `bits` is before the first step's or after the last logged step's bits. Next to a
    step at error 0 (exact consensus, as an all-reduce reaches: no log-log line goes there) the
    error is that of the last logged step within `bits`."""
    rows = _logged_points(history)
    if not rows or not rows[0]["bits_per_peer"] <= bits <= rows[-1]["bits_per_peer"]:
        return None
    for a, b in zip(rows, rows[1:]):
        if a["bits_per_peer"] <= bits <= b["bits_per_peer"]:
            if a["error"] == 0 or b["error"] == 0:
                return b["error"] if bits == b["bits_per_peer"] else a["error"]
            return _loglog(a["bits_per_peer"], a["error"], b["bits_per_peer"], b["error"], bits)
    return rows[0]["error"]  # a single logged step, exactly at `bits`


def bits_to_reach(history: Sequence[Dict], relative: float) -> Optional[float]:
    """Bits per peer at which the error first falls to `relative` x the initial error, log-log
    interpolated between the logged steps around the crossing (at a step that reaches error 0,
    exact consensus, that step's bits); None if the run never got there."""
    target, rows = relative * history[0]["error"], _logged_points(history)
    for k, row in enumerate(rows):
        if row["error"] <= target:
            if k == 0 or row["error"] == 0:
                return row["bits_per_peer"]
            a, b = rows[k - 1], row
            return _loglog(a["error"], a["bits_per_peer"], b["error"], b["bits_per_peer"], target)
    return None
