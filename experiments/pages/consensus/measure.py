"""The consensus measurements: one run's error curve (`consensus_curve`, collective), the runs an
instance makes (`expand`), and the comparison at matched bits: the error at exactly B bits per
peer and the bits to reach a relative error, log-log interpolated between the recorded steps
around the point, the tables' cells (`cells_for`) and the best γ per budget (`summarize`)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from .problems import make_problem

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Communicator

BUDGETS = (1e5, 1e6, 1e7)
#: Relative errors whose bits-to-reach the tables report.
REACH_TARGETS = (1e-2, 1e-4)
#: A run stops once its error is at most this multiple of the initial error ("reached").
STOP_RELATIVE = 1e-12
#: The precision floor of a state in dtype d: FLOOR_ULPS x eps(d)^2 x mean_i ||x_i||^2 (about one
#: rounding error per entry of the state and of each of its copies, squared). Values <=
#: FLOOR_MARGIN x the floor are marked "at precision floor", and a run stops there ("floor").
FLOOR_ULPS, FLOOR_MARGIN = 100.0, 10.0
#: A run stops as diverged once its error exceeds this multiple of the initial error.
DIVERGE_FACTOR = 1e4
#: A run goes until it has sent more than the largest budget, at most this many steps.
STEP_CAP = 100_000
#: The spec PowerGossip rank 1 runs with; `topk:matched` matches its floats per message.
MATCHED_SPEC = "powergossip:rank=1,iters=1,warm=true"


def eval_steps(max_steps: int, dense: int = 20, ratio: float = 1.06, max_gap: int = 20) -> set:
    """Steps at which the error is recorded (besides budget boundaries and the last step):
    every step up to `dense`, then a geometric grid with gaps of at most `max_gap` steps."""
    steps, value = set(range(0, min(dense, max_steps) + 1)), float(dense)
    while value < max_steps:
        value = min(value * ratio, value + max_gap)
        steps.add(min(int(round(value)), max_steps))
    return steps


def _regular(comm: Communicator) -> bool:
    """Every peer of a static undirected graph has the same degree (so sends as much per step)."""
    topology = comm.topology
    if not comm.is_static or topology.is_directed:
        return False
    return len({len(topology.neighbors(i)) for i in range(topology.size)}) == 1


def precision_floor(mean_norm2: float, dtype) -> float:
    """The error below which a state in `dtype` cannot average further (see FLOOR_ULPS)."""
    import torch

    return FLOOR_ULPS * torch.finfo(dtype).eps ** 2 * mean_norm2


def consensus_curve(
    comm: Communicator,
    problem: str,
    spec: str,
    max_steps: int,
    max_bits: float,
    budgets: Sequence[float] = BUDGETS,
    stop_error: Optional[float] = None,
    seed: int = 0,
    dtype: str = "float32",
    models_file: Optional[str] = None,
    stop_at_floor: bool = False,
) -> Dict:
    """Run one algorithm on this peer: {"history": [{"step", "bits_per_peer", "error"}, ...] (the
    same on every peer), "stop", "seconds", "bytes_sent", "floor", "norm2" (mean_i ||x_i||^2)}.

    Bits per peer are 8 x the transport's count of bytes sent. The run stops after the first step
    beyond `max_bits`, after `max_steps`, once the error is not finite or above DIVERGE_FACTOR x
    the initial error ("diverged"), with `stop_at_floor` within FLOOR_MARGIN of the precision
    floor ("floor"), with `stop_error` at that relative error ("reached"). Around every budget the
    last step within it and the first beyond it are recorded (interpolation brackets)."""
    import torch

    from gossip_powersgd import consensus_distance, make_algorithm

    start = time.perf_counter()
    tensors = make_problem(problem, comm.rank, getattr(torch, dtype), seed, models_file)
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
    floor = precision_floor(norm2, getattr(torch, dtype))
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


def matched_ratio(
    comm: Communicator, problem: str, dtype: str, seed: int = 0, models_file=None
) -> float:
    """The top-k ratio matching PowerGossip rank 1's floats per message, measured over 2 steps."""
    import torch

    from gossip_powersgd import make_algorithm

    tensors = make_problem(problem, comm.rank, getattr(torch, dtype), seed, models_file)
    algorithm = make_algorithm(MATCHED_SPEC, tensors, comm)
    bytes0, messages0 = comm.stats.bytes_sent, comm.stats.messages_sent
    for _ in range(2):
        algorithm.step()
    messages = comm.stats.messages_sent - messages0
    if messages == 0:
        return 1.0
    floats = (comm.stats.bytes_sent - bytes0) / messages / tensors[0].element_size()
    return float(f"{floats / sum(t.numel() for t in tensors):.4g}")


def matched(spec: str, ratio: Optional[float]) -> str:
    """`spec` with `topk:matched` resolved to top-k at `ratio`."""
    return spec.replace("topk:matched", f"topk:{ratio:g}") if ratio else spec


def expand(specs: Sequence[str], gammas: Sequence[float], ratio: Optional[float]) -> List[Dict]:
    """The runs to make, [{"label", "spec", "swept"}]: `topk:matched` resolved to `ratio`; an
    algorithm whose γ must be tuned (the registry says), given without γ, once per γ of `gammas`."""
    from gossip_powersgd.algorithms import algorithm_label, gamma_kind, with_option
    from gossip_powersgd.algorithms.registry import split_spec

    runs = []
    for spec in map(matched, specs, [ratio] * len(specs)):
        label = algorithm_label(spec)
        if gamma_kind(spec) == "tuned" and "gamma" not in split_spec(spec)[1]:
            runs += [
                {"label": label, "spec": with_option(spec, "gamma", f"{g:g}"), "swept": True}
                for g in gammas
            ]
        else:
            runs.append({"label": label, "spec": spec, "swept": False})
    if len({r["spec"] for r in runs}) != len(runs):
        raise ValueError("the same algorithm spec is given twice: give each spec once")
    return runs


def _loglog(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    """y at x on the straight line through (x0, y0), (x1, y1) in log-log coordinates."""
    if x1 == x0:
        return y1
    t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


def positive_points(history: Sequence[Dict]) -> List[Dict]:
    """The records of a curve that can be placed on log-log axes (positive, finite)."""
    return [r for r in history if r["bits_per_peer"] > 0 and 0 < r["error"] < math.inf]


def error_at_bits(history: Sequence[Dict], bits: float) -> Optional[float]:
    """The error at `bits` per peer, log-log interpolated between the logged steps around it;
    None when `bits` is before the first step's or after the last logged step's bits."""
    rows = positive_points(history)
    if not rows or not rows[0]["bits_per_peer"] <= bits <= rows[-1]["bits_per_peer"]:
        return None
    for a, b in zip(rows, rows[1:]):
        if a["bits_per_peer"] <= bits <= b["bits_per_peer"]:
            return _loglog(a["bits_per_peer"], a["error"], b["bits_per_peer"], b["error"], bits)
    return rows[0]["error"]  # a single logged step, exactly at `bits`


def bits_to_reach(history: Sequence[Dict], relative: float) -> Optional[float]:
    """Bits per peer at which the error first falls to `relative` x the initial error, log-log
    interpolated between the logged steps around the crossing; None if the run never got there."""
    target, rows = relative * history[0]["error"], positive_points(history)
    for k, row in enumerate(rows):
        if row["error"] <= target:
            if k == 0:
                return row["bits_per_peer"]
            a, b = rows[k - 1], row
            return _loglog(a["error"], a["bits_per_peer"], b["error"], b["bits_per_peer"], target)
    return None


def reach_cells(history: Sequence[Dict]) -> Dict[float, Optional[float]]:
    """Bits per peer to reach each of REACH_TARGETS (None: not within the run)."""
    return {t: bits_to_reach(history, t) for t in REACH_TARGETS}


def cells_for(history, budgets, stop: str, stage: str, floor: Optional[float] = None) -> Dict:
    """Per budget, the run's error at exactly that many bits per peer (`error_at_bits`), as
    {"status": "ok", "row": {"bits_per_peer", "error", "relative", "bound", "at_floor"}}. A run that
    stopped early ("reached", "floor") gets its last error as an upper bound ("bound") beyond;
    otherwise a budget it never reached is "diverged", "screened out" (a sweep's screening run not
    picked for the full length) or "not reached"; "—" when the first step costs more."""
    error0, steps = history[0]["error"], [r for r in history if r["step"] >= 1]
    if not steps or steps[0]["step"] != 1:
        raise ValueError("history must record step 1")
    cells: Dict[float, Dict] = {}
    for budget in budgets:
        if steps[0]["bits_per_peer"] > budget:
            cells[budget] = {"status": "—"}
            continue
        error, bound = error_at_bits(history, budget), False
        if steps[-1]["bits_per_peer"] < budget:
            if stop not in ("reached", "floor"):
                screened = "screened out" if stage == "screen" and stop == "max_bits" else None
                cells[budget] = {
                    "status": "diverged" if stop == "diverged" else screened or "not reached"
                }
                continue
            error, bound = steps[-1]["error"], True
        at_floor = floor is not None and error <= FLOOR_MARGIN * floor
        row = {"bits_per_peer": float(budget), "error": error, "relative": error / error0}
        cells[budget] = {"status": "ok", "row": {**row, "bound": bound, "at_floor": at_floor}}
    return cells


def summarize(results: Sequence[Dict], budgets: Sequence[float]) -> Dict[str, Dict]:
    """Per label: for each budget the best run (lowest error among those that reached it and had
    not diverged), and the run to plot (`plot_spec`: best at the largest budget any run reached)."""
    table: Dict[str, Dict] = {}
    for result in results:
        new = {"runs": [], "budgets": {}, "swept": result["swept"]}
        table.setdefault(result["label"], new)["runs"].append(result)
    for entry in table.values():
        for budget in budgets:
            best, statuses = None, set()
            for result in entry["runs"]:
                cell = result["budgets"][budget]
                statuses.add(cell["status"])
                ok = cell["status"] == "ok" and math.isfinite(cell["row"]["error"])
                if ok and (best is None or cell["row"]["error"] < best["row"]["error"]):
                    best = {**cell, "gamma": result["gamma"], "spec": result["spec"]}
            if best is None:
                status = {frozenset({"—"}): "—", frozenset({"diverged"}): "diverged"}
                best = {"status": status.get(frozenset(statuses), "not reached")}
            entry["budgets"][budget] = best
        cells = [entry["budgets"][b] for b in sorted(budgets, reverse=True)]
        entry["plot_spec"] = next(
            (c["spec"] for c in cells if c["status"] == "ok"), entry["runs"][0]["spec"]
        )
    return table
