"""The consensus measurements: one run's error curve (`consensus_curve`), the runs of an instance
(`expand`), the cells at matched bits (`cells_for`) and the best γ per budget (`summarize`)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from gossip_powersgd.consensus_problems import make_problem
from gossip_powersgd.metrics import FLOOR_MARGIN, bits_to_reach, error_at_bits


if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Communicator

BUDGETS = (1e5, 1e6, 1e7)
#: Relative errors whose bits-to-reach the tables report.
REACH_TARGETS = (1e-2, 1e-4)
#: A run stops once its error is at most this multiple of the initial error ("reached").
STOP_RELATIVE = 1e-12
#: A run goes until it has sent more than the largest budget, at most this many steps.
STEP_CAP = 100_000
#: The spec PowerGossip rank 1 runs with; `topk:matched` matches its floats per message.
MATCHED_SPEC = "powergossip:rank=1,iters=1,warm=true"


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
    """`gossip_powersgd.metrics.consensus_curve` of `spec` on this peer's part of `problem` in
    `dtype` (its "seconds" count making the problem too)."""
    import torch

    from gossip_powersgd.metrics import consensus_curve as curve

    start = time.perf_counter()
    tensors = make_problem(problem, comm.rank, getattr(torch, dtype), seed, models_file)
    out = curve(comm, spec, tensors, max_steps, max_bits, budgets, stop_error, stop_at_floor)
    return dict(out, seconds=time.perf_counter() - start)


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


def reach_cells(history: Sequence[Dict]) -> Dict[float, Optional[float]]:
    """Bits per peer to reach each of REACH_TARGETS (None: not within the run)."""
    return {t: bits_to_reach(history, t) for t in REACH_TARGETS}


def cells_for(history, budgets, stop: str, stage: str, floor: Optional[float] = None) -> Dict:
    """Per budget, {"status": "ok", "row": {"bits_per_peer", "error", "relative", "bound",
    "at_floor"}}: the error at exactly that many bits per peer, or the last error as an upper bound
    ("bound") past a run that stopped early; else "diverged", "screened out", "not reached" or "—"."""
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
