"""The consensus experiment's measurements: the problems, one run's error curve, the runs to make,
and the best γ per bit budget. Nothing here writes files or formats text (see `report`)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import torch

from .matched import error_at_bits
from .problems import SEED_BASE, cnn1d_shapes, make_problem, problem_shapes  # noqa: F401 (names others import from here)

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

BUDGETS = (1e5, 1e6, 1e7)
#: 8 values, log-uniform from 1e-3 to 1 (rounded to 3 significant digits), then beyond 1 up to 2,
#: past the topologies' consensus step (1.31 on ring:8, 1 on torus:4x4), where Choco-sign's best lies.
DEFAULT_GAMMAS = tuple(float(f"{10 ** (-3 + 3 * k / 7):.3g}") for k in range(8)) + (1.4, 2.0)
#: The coarser grid of the added problems (and of the report's original ones, to fit its time).
COARSE_GAMMAS = (0.01, 0.03, 0.1, 0.3, 1.0, 1.2, 1.4, 2.0)
#: A run stops once its error is at most this multiple of the initial error ("reached").
STOP_RELATIVE = 1e-12
#: The precision floor of a state in dtype d: FLOOR_ULPS x eps(d)^2 x mean_i ||x_i||^2 (about one
#: rounding error per entry of the state and of each of its copies, squared; float32 Choco-sign
#: stalled at 83 x eps^2 x mean ||x_i||^2 on the previous page). Values <= FLOOR_MARGIN x the floor
#: are marked "at precision floor", and a run stops there ("reached floor").
FLOOR_ULPS, FLOOR_MARGIN = 100.0, 10.0
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: A run stops as diverged once its error exceeds this multiple of the initial error.
DIVERGE_FACTOR = 1e4
#: Without --steps, a run goes until it has sent more than the largest budget, at most this long.
STEP_CAP = 100_000

#: Algorithms that run at the topology's γ (no tuning).
UNTUNED = (
    "exact",
    "powergossip:rank=1,iters=1,warm=true",
    "powergossip:rank=2,iters=1,warm=true",
    "powergossip:rank=4,iters=1,warm=true",
    "powergossip:rank=1,iters=1,warm=false",
)
#: The algorithms of the added problems (and of the winner map, and of seeds beyond the first).
WINNER_SPECS = (
    "exact",
    "powergossip:rank=1,iters=1,warm=true",
    "powergossip:rank=4,iters=1,warm=true",
    "choco:compressor=sign",
    "choco:compressor=topk:matched",
)
#: Baselines whose γ must be tuned: `--sweep` runs each at every γ of the grid.
BASELINES = (
    "choco:compressor=sign",
    "choco:compressor=topk:matched",
    "choco:compressor=lowrank:1",
    "deepsqueeze:compressor=sign",
    "deepsqueeze:compressor=topk:matched",
    "deepsqueeze:compressor=lowrank:1",
)
#: The spec PowerGossip rank 1 runs with; `topk:matched` matches its floats per message.
MATCHED_SPEC = "powergossip:rank=1,iters=1,warm=true"


# --------------------------------------------------------------------------------------------------
# one run


def eval_steps(max_steps: int, dense: int = 20, ratio: float = 1.06, max_gap: int = 20) -> set:
    """Steps at which the error is recorded (besides budget boundaries and the last step):
    every step up to `dense`, then a geometric grid with gaps of at most `max_gap` steps."""
    steps = set(range(0, min(dense, max_steps) + 1))
    value = float(dense)
    while value < max_steps:
        value = min(value * ratio, value + max_gap)
        steps.add(min(int(round(value)), max_steps))
    return steps


def _regular(comm: Comm) -> bool:
    """Whether every peer has the same degree on a static undirected graph. A schedule's or a
    directed graph's traffic can differ per peer and per step, so those always count by collective."""
    topology = comm.topology
    if not comm.is_static or topology.is_directed:
        return False
    return len({len(topology.neighbors(i)) for i in range(topology.size)}) == 1


def precision_floor(mean_norm2: float, dtype) -> float:
    """The error below which a state in `dtype` cannot average further (see FLOOR_ULPS)."""
    return FLOOR_ULPS * torch.finfo(dtype).eps ** 2 * mean_norm2


def consensus_curve(
    comm: Comm,
    problem: str,
    spec: str,
    max_steps: int,
    max_bits: float,
    budgets: Sequence[float] = BUDGETS,
    diverge_factor: float = DIVERGE_FACTOR,
    stop_error: Optional[float] = None,
    seed: int = 0,
    dtype: str = "float32",
    models_file: Optional[str] = None,
    stop_at_floor: bool = False,
) -> Dict:
    """Run one algorithm on one peer of the consensus problem (collective: every peer calls it).

    Returns {"history": [{"step", "bits_per_peer", "error"}, ...], "stop": why it stopped,
    "seconds": wall time, "floor": the precision floor, "norm2": mean_i ||x_i||^2 at the start}.
    Every peer returns the same history. The run stops after the first step whose cumulative bits
    per peer exceed `max_bits`, after `max_steps` steps, once the error is not finite or above
    `diverge_factor` x the initial error ("diverged"), with `stop_at_floor` once a recorded error
    is within FLOOR_MARGIN of the dtype's precision floor ("floor"), or, with `stop_error`, once a recorded error is at
    most `stop_error` x the initial error ("reached"). Around every budget the last step within it
    and the first step beyond it are recorded, so that the error at the budget is interpolated
    between neighbouring steps.
    """
    from gossip_powersgd import consensus_distance, make_algorithm

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    tensors = make_problem(problem, comm.rank, DTYPES[dtype], seed, models_file)
    algorithm = make_algorithm(spec, tensors, comm)
    regular = _regular(comm)
    bytes0 = comm.stats.bytes_sent

    def bits_now() -> float:
        own = float(8 * (comm.stats.bytes_sent - bytes0))
        if regular:  # every peer sends as much (same algorithm, same degree): no collective needed
            return own
        return float(
            comm.allreduce_(torch.tensor([own], dtype=torch.float64), op="mean", metric=True)
        )

    schedule = eval_steps(max_steps)
    ordered = sorted(float(b) for b in budgets)
    error0 = consensus_distance(tensors, comm)
    own_norm2 = sum(float(t.double().square().sum()) for t in tensors)
    norm2 = float(
        comm.allreduce_(torch.tensor([own_norm2], dtype=torch.float64), op="mean", metric=True)
    )
    floor = precision_floor(norm2, DTYPES[dtype])
    history = [{"step": 0, "bits_per_peer": 0.0, "error": error0}]
    previous = [t.detach().clone() for t in tensors]
    previous_bits, stop = 0.0, "max_steps"
    for step in range(1, max_steps + 1):
        for saved, t in zip(previous, tensors):
            saved.copy_(t)
        algorithm.step()
        bits = bits_now()
        # The previous step was the last one within a budget: record it (from the saved copy), and
        # this one, the first beyond it.
        crossed = any(previous_bits <= b < bits for b in ordered)
        if crossed and step > 1 and history[-1]["step"] != step - 1:
            history.append(
                {
                    "step": step - 1,
                    "bits_per_peer": previous_bits,
                    "error": consensus_distance(previous, comm),
                }
            )
        last = step == max_steps or bits > max_bits
        if step in schedule or last or crossed:
            error = consensus_distance(tensors, comm)
            history.append({"step": step, "bits_per_peer": bits, "error": error})
            if not math.isfinite(error) or error > diverge_factor * error0:
                stop = "diverged"
                break
            if stop_at_floor and error <= FLOOR_MARGIN * floor:
                stop = "floor"
                break
            if stop_error is not None and error <= stop_error * error0:
                stop = "reached"
                break
        if bits > max_bits:
            stop = "max_bits"
            break
        previous_bits = bits
    if regular and comm.size > 1:  # check the no-collective shortcut: all peers counted the same
        own = torch.tensor([float(comm.stats.bytes_sent - bytes0)], dtype=torch.float64)
        low = comm.allreduce_(own.clone(), op="min", metric=True)
        high = comm.allreduce_(own.clone(), op="max", metric=True)
        if float(low) != float(high):
            raise RuntimeError(
                f"{spec}: peers of a regular topology sent different byte counts "
                f"({float(low):.0f} .. {float(high):.0f})"
            )
    return {
        "history": history,
        "stop": stop,
        "seconds": time.perf_counter() - start,
        "bytes_sent": comm.stats.bytes_sent - bytes0,
        "floor": floor,
        "norm2": norm2,
    }


def matched_ratio(
    comm: Comm,
    problem: str,
    dtype: str = "float32",
    seed: int = 0,
    models_file: Optional[str] = None,
) -> float:
    """Top-k ratio matching PowerGossip rank 1's floats per message: measured over 2 steps."""
    from gossip_powersgd import make_algorithm

    tensors = make_problem(problem, comm.rank, DTYPES[dtype], seed, models_file)
    algorithm = make_algorithm(MATCHED_SPEC, tensors, comm)
    bytes0, messages0 = comm.stats.bytes_sent, comm.stats.messages_sent
    for _ in range(2):
        algorithm.step()
    messages = comm.stats.messages_sent - messages0
    if messages == 0:
        return 1.0
    floats = (comm.stats.bytes_sent - bytes0) / messages / tensors[0].element_size()
    return float(f"{floats / sum(t.numel() for t in tensors):.4g}")


# --------------------------------------------------------------------------------------------------
# the runs to make, and the best γ per budget


def expand(
    specs: Sequence[str], sweep: bool, gammas: Sequence[float], ratio: Optional[float]
) -> List[Dict]:
    """The runs to make: [{"label", "spec", "swept"}]; `topk:matched` resolved to `ratio`.

    An algorithm whose γ the registry marks as needing tuning, given without γ, runs once per γ of
    `gammas` when sweeping, and is refused otherwise."""
    from gossip_powersgd.algorithms import algorithm_label, gamma_kind, with_option
    from gossip_powersgd.algorithms.registry import split_spec

    runs = []
    for spec in specs:
        if "topk:matched" in spec:
            spec = spec.replace("topk:matched", f"topk:{ratio:g}")
        label = algorithm_label(spec)
        if gamma_kind(spec) == "tuned" and "gamma" not in split_spec(spec)[1]:
            if not sweep:
                raise ValueError(
                    f"{spec!r} needs a tuned gamma: add gamma=... to the spec or pass "
                    "--sweep to try every value of --gammas"
                )
            runs += [
                {"label": label, "spec": with_option(spec, "gamma", f"{g:g}"), "swept": True}
                for g in gammas
            ]
        else:
            runs.append({"label": label, "spec": spec, "swept": False})
    specs_made = [r["spec"] for r in runs]
    if len(set(specs_made)) != len(specs_made):
        raise ValueError("the same algorithm spec is given twice: give each spec once")
    return runs


def budget_rows(history: Sequence[Dict], budgets: Sequence[float] = BUDGETS) -> Dict[float, Dict]:
    """For each budget: {"status": "ok", "row": the last row with bits_per_peer <= budget} when
    the run went past the budget; {"status": "—"} when its first step already exceeds it;
    {"status": "not reached"} when the history ends within the budget (stopped early)."""
    out = {}
    steps = [r for r in history if r["step"] >= 1]
    for budget in budgets:
        if not steps or steps[0]["step"] != 1:
            raise ValueError("history must record step 1")
        if steps[0]["bits_per_peer"] > budget:
            out[budget] = {"status": "—"}
        elif steps[-1]["bits_per_peer"] <= budget:
            out[budget] = {"status": "not reached"}
        else:
            row = max((r for r in steps if r["bits_per_peer"] <= budget), key=lambda r: r["step"])
            out[budget] = {"status": "ok", "row": row}
    return out


def cells_for(
    history: Sequence[Dict],
    budgets: Sequence[float],
    stop: str,
    stage: str,
    floor: Optional[float] = None,
) -> Dict[float, Dict]:
    """Per budget, the run's error at exactly that many bits per peer (`error_at_bits`: log-log
    interpolated between the recorded steps around it), as {"status": "ok", "row": {"bits_per_peer",
    "error", "relative", "bound", "at_floor"}}. A run that stopped early below its target or at
    the precision floor ("reached", "floor") gets its last error as an upper bound ("bound": True)
    at the budgets beyond; otherwise a budget it never reached is "diverged", "screened out" (a
    sweep's screening run not picked for the full length) or "not reached"; "—" when the first step
    already costs more than the budget."""
    error0 = history[0]["error"]
    steps = [r for r in history if r["step"] >= 1]
    if not steps or steps[0]["step"] != 1:
        raise ValueError("history must record step 1")
    cells: Dict[float, Dict] = {}
    for budget in budgets:
        if steps[0]["bits_per_peer"] > budget:
            cells[budget] = {"status": "—"}
            continue
        if steps[-1]["bits_per_peer"] < budget:
            if stop in ("reached", "floor"):
                error, bound = steps[-1]["error"], True
            else:
                status = {"diverged": "diverged"}.get(
                    stop,
                    "screened out" if stage == "screen" and stop == "max_bits" else "not reached",
                )
                cells[budget] = {"status": status}
                continue
        else:
            error, bound = error_at_bits(history, budget), False
        at_floor = floor is not None and error <= FLOOR_MARGIN * floor
        cells[budget] = {
            "status": "ok",
            "row": {
                "bits_per_peer": float(budget),
                "error": error,
                "relative": error / error0,
                "bound": bound,
                "at_floor": at_floor,
            },
        }
    return cells


def summarize(results: Sequence[Dict], budgets: Sequence[float]) -> Dict[str, Dict]:
    """Per label: for each budget the best run (lowest error among the runs that reached it and
    had not diverged by then), and the run to plot (best at the largest budget any run reached)."""
    table: Dict[str, Dict] = {}
    for result in results:
        entry = table.setdefault(
            result["label"], {"runs": [], "budgets": {}, "swept": result["swept"]}
        )
        entry["runs"].append(result)
    for label, entry in table.items():
        for budget in budgets:
            best = None
            statuses = set()
            for result in entry["runs"]:
                cell = result["budgets"][budget]
                statuses.add(cell["status"])
                if cell["status"] == "ok" and math.isfinite(cell["row"]["error"]):
                    if best is None or cell["row"]["error"] < best["row"]["error"]:
                        best = {**cell, "gamma": result["gamma"], "spec": result["spec"]}
            if best is None:
                status = (
                    "—"
                    if statuses == {"—"}
                    else ("diverged" if statuses == {"diverged"} else "not reached")
                )
                best = {"status": status}
            entry["budgets"][budget] = best
        plotted = None
        for budget in sorted(budgets, reverse=True):
            if entry["budgets"][budget]["status"] == "ok":
                plotted = entry["budgets"][budget]["spec"]
                break
        entry["plot_spec"] = plotted or entry["runs"][0]["spec"]
    return table
