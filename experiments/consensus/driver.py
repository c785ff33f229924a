"""The consensus experiment's driver: run every algorithm (every γ when sweeping) on every peer,
through `run_peers` on either transport, on one or more seeds, and hand the record to the report."""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Sequence

import torch

from gossip_powersgd.launch import mpi_world, resolve_backend, run_peers
from gossip_powersgd.utils import check_writable_dir

from .compare import reach_cells
from .measure import (
    BASELINES,
    BUDGETS,
    DEFAULT_GAMMAS,
    DIVERGE_FACTOR,
    DTYPES,
    STEP_CAP,
    UNTUNED,
    cells_for,
    consensus_curve,
    expand,
    matched_ratio,
    summarize,
)
from .models import ensure_models
from .problems import parse_problem, problem_shapes
from .report import SCRATCH_OUT, default_out, fmt_err, format_table, run_file, write_outputs

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

#: The report's instances, in the order they run: (topology, problem, kind). "full": an original
#: problem with the full algorithm list on seed 0 (the winner-map algorithms also on seeds 1-2);
#: "added": a new problem with the winner-map algorithms (WINNER_SPECS) on 3 seeds (`models`: 1).
#: Cut to fit the time (one added instance takes about 160 s on ring:8 and twice that on
#: torus:4x4 on 2 shared cores): the page lists what of `FULL_GRID` did not run.
ORIGINAL_PROBLEMS = ("matrix", "cnn")
ADDED_PROBLEMS = (
    "spectral:alpha=0",
    "spectral:alpha=0.5",
    "spectral:alpha=1",
    "spectral:alpha=2",
    "lowrank:r=4,sigma=0",
    "lowrank:r=4,sigma=0.1",
    "lowrank:r=4,sigma=0.3",
    "lowrank:r=1,sigma=0.1",
    "lowrank:r=16,sigma=0.1",
    "offset:beta=10",
    "models:epoch=1",
    "models:epoch=10",
    "models:epoch=30",
)
#: Run after the first report (`--report --missing`): the clean low-rank cases at r = 1 and 16,
#: σ = 0.03 at r = 4, and on torus:4x4 the problems where the ring's ranking flips.
LATER_RING = ("lowrank:r=1,sigma=0", "lowrank:r=16,sigma=0", "lowrank:r=4,sigma=0.03")
LATER_TORUS = (
    "spectral:alpha=0",
    "spectral:alpha=1",
    "lowrank:r=4,sigma=0",
    "lowrank:r=4,sigma=0.1",
    "offset:beta=10",
)
REPORT_CONFIGS = (
    tuple(("ring:8", p, "full") for p in ORIGINAL_PROBLEMS)
    + tuple(("ring:8", p, "added") for p in ADDED_PROBLEMS)
    + (("torus:4x4", "matrix", "full"), ("torus:4x4", "spectral:alpha=2", "added"))
    + tuple(("ring:8", p, "added") for p in LATER_RING)
    + tuple(("torus:4x4", p, "added") for p in LATER_TORUS)
)
#: Every problem the report would run on each topology given the time (`offset:beta=0` is the
#: `matrix` problem itself, so it is not listed apart).
FULL_GRID = (
    ORIGINAL_PROBLEMS
    + tuple(f"spectral:alpha={a:g}" for a in (0, 0.5, 1, 2))
    + tuple(f"lowrank:r={r},sigma={s:g}" for r in (1, 4, 16) for s in (0, 0.03, 0.1, 0.3))
    + ("offset:beta=10",)
    + tuple(f"models:epoch={e}" for e in (1, 10, 30))
)
REPORT_SEEDS = (0, 1, 2)
#: The local backend runs one thread per peer; the interpreter's default 5 ms switch interval makes
#: those threads hand the GIL back and forth mid-step. A longer interval runs the same (deterministic:
#: peers synchronise on every message) computation 2-4x faster on 2 cores.
LOCAL_SWITCH_INTERVAL_S = 0.05


def _same_on_every_peer(values: Dict[int, Dict], spec: str) -> Dict:
    """Rank 0's outcome (this rank's under MPI), after checking every local peer recorded it too."""
    ranks = sorted(values)
    first = values[ranks[0]]
    for rank in ranks[1:]:
        if values[rank]["history"] != first["history"]:
            raise RuntimeError(
                f"{spec}: peer {rank} recorded a different history than peer {ranks[0]}"
            )
    return first


def parse_topology(topology: str, weights: Optional[str]):
    """The topology; `weights` None keeps the spec's own (uniform 1/(degree+1) on static graphs;
    schedules and directed graphs fix theirs). Refuses, in one line, what the consensus runs
    cannot use: a topology without a consensus step γ (schedules, directed graphs)."""
    import topologies

    topo = topologies.parse(topology, weights=weights)
    if not isinstance(topo, topologies.Topology):  # (asking for topo.gamma would compute it)
        raise ValueError(
            f"topology {topology!r} has no consensus step γ (a schedule or a directed "
            "graph): the consensus experiment runs on static undirected graphs; use "
            "e.g. ring:16, torus:4x4 or exponential:16"
        )
    return topo


def physical_memory() -> Optional[int]:
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(topo, problem: str, dtype: str, backend: str) -> None:
    """A one-line ValueError, before anything is allocated, when the peers of this process would
    hold more than the machine's memory: each peer keeps its tensors about 2 + degree times (its
    state, what it sends, one message from each neighbour); the local backend runs every peer."""
    floats = sum(math.prod(shape) for shape in problem_shapes(problem))
    copies = 2 + max(topo.degrees)
    peers = topo.size if backend == "local" else 1
    need = peers * floats * DTYPES[dtype].itemsize * copies
    have = physical_memory()
    if have is not None and need > have:
        raise ValueError(
            f"problem {problem!r} on {topo.name} needs about {need / 2**30:.3g} GiB "
            f"({peers} peer(s) x {floats} floats x {copies} copies, {dtype}), more than "
            f"this machine's {have / 2**30:.3g} GiB; use a smaller problem or topology"
        )


def _build_every(comm: Comm, specs: Sequence[str], problem: str, dtype: str) -> bool:
    """Build (and drop) every algorithm on this peer, on zeros shaped like the problem: what a run
    would refuse (a bad option, a rank too large for the tensors, an unstable γ) it refuses here."""
    from gossip_powersgd import make_algorithm

    for spec in specs:
        make_algorithm(
            spec,
            [torch.zeros(shape, dtype=DTYPES[dtype]) for shape in problem_shapes(problem)],
            comm,
        )
    return True


def check_specs(
    topo,
    algorithms: Sequence[str],
    sweep: bool,
    gammas: Sequence[float],
    problem: str,
    dtype: str,
    backend: str,
) -> None:
    """Every run's algorithm built once on every peer before the first run, so that a bad last spec
    does not fail after the runs before it (`topk:matched` is checked as top-k)."""
    specs = [run["spec"] for run in expand(algorithms, sweep, gammas, 0.5)]
    run_peers(topo, _build_every, specs, problem, dtype, backend=backend)


class _SwitchInterval:
    """Sets sys.setswitchinterval for a block, and restores it."""

    def __init__(self, seconds: Optional[float]):
        self.seconds, self.saved = seconds, None

    def __enter__(self):
        if self.seconds is not None:
            self.saved = sys.getswitchinterval()
            sys.setswitchinterval(self.seconds)

    def __exit__(self, *exc):
        if self.saved is not None:
            sys.setswitchinterval(self.saved)


def run_experiment(
    topology: str = "ring:8",
    problem: str = "matrix",
    algorithms: Optional[Sequence[str]] = None,
    steps: Optional[int] = None,
    backend: str = "local",
    out: Optional[Path] = None,
    sweep: bool = False,
    gammas: Sequence[float] = DEFAULT_GAMMAS,
    budgets: Sequence[float] = BUDGETS,
    weights: Optional[str] = None,
    max_bits: Optional[float] = None,
    sweep_bits: Optional[float] = None,
    finalists: int = 2,
    log=print,
    write: bool = True,
    plots: bool = True,
    command: Optional[str] = None,
    seeds: Sequence[int] = (0,),
    dtype: str = "float64",
    stop_relative: Optional[float] = None,
    reseed: Optional[Sequence[str]] = None,
    models_dir: Optional[Path] = None,
) -> Dict:
    """Run every algorithm (every gamma when sweeping) on seed 0, then the `reseed` algorithms
    (default all) on the other `seeds`, a tuned one at its best γ on seed 0 at the largest budget;
    write the outputs; return the record.

    Sweeping is two-stage when `sweep_bits` (default: the second largest budget) is below
    `max_bits` (default: the largest budget): every gamma runs until it exceeds `sweep_bits`, then
    the `finalists` best gammas at `sweep_bits` are rerun to `max_bits`. So the table's columns up
    to `sweep_bits` are the best over the whole grid, the others the best over the finalists.
    `models:epoch=E` problems train their models first (cached in `models_dir`).

    Under `backend="mpi"` this is collective (every rank calls it, rank 0 writes and logs).
    """
    from gossip_powersgd.algorithms import algorithm_label, spec_gamma

    torch.set_num_threads(1)
    backend = resolve_backend(backend)
    if backend == "mpi":
        from mpi4py import MPI  # noqa: F401 - initialises MPI, so that mpi_world() knows this rank

    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: use float32 or float64")
    seeds = tuple(dict.fromkeys(int(s) for s in seeds))
    if not seeds or seeds[0] != 0 or min(seeds) < 0:
        raise ValueError(
            f"seeds {seeds}: give 0 first (the γ sweep runs on seed 0), then others >= 1"
        )
    topo = parse_topology(topology, weights)
    name, _ = parse_problem(problem)  # validate before anything runs
    if name == "models" and backend != "local":
        raise ValueError("models:epoch=E problems train on the local backend: drop --backend mpi")
    check_memory(topo, problem, dtype, backend)
    budgets = tuple(sorted(float(b) for b in budgets))
    max_bits = float(max_bits if max_bits is not None else budgets[-1])
    max_steps = int(steps) if steps else STEP_CAP
    if algorithms is None:
        algorithms = UNTUNED + (BASELINES if sweep else ())
    with _SwitchInterval(LOCAL_SWITCH_INTERVAL_S if backend == "local" else None):
        check_specs(topo, algorithms, sweep, gammas, problem, dtype, backend)
    out = Path(out) if out is not None else default_out(topology, problem)
    is_root = mpi_world()[0] == 0
    if write and is_root:  # last of the checks: found now, not after every run (their results lost)
        check_writable_dir(out, "choose a writable --out")
    say = log if is_root else (lambda *a, **k: None)
    started = time.perf_counter()
    switch = _SwitchInterval(LOCAL_SWITCH_INTERVAL_S if backend == "local" else None)
    models_files: Dict[int, Optional[str]] = {s: None for s in seeds}
    if name == "models":
        # One training (seed 0) gives every peer's models: the consensus problem has no other
        # randomness, so further seeds would repeat it; they are dropped.
        seeds = (0,)
        base = Path(models_dir) if models_dir is not None else SCRATCH_OUT / "models"
        with switch:
            models_files[0] = str(ensure_models(topology, 0, base, log=say))
    ratio = None
    with switch:
        if any("topk:matched" in a for a in algorithms):
            ratio = next(
                iter(
                    run_peers(
                        topo, matched_ratio, problem, dtype, 0, models_files[0], backend=backend
                    ).values()
                )
            )
    plan = expand(algorithms, sweep, gammas, ratio)
    reseed_labels = (
        None
        if reseed is None
        else {  # labels as `expand` makes them (top-k resolved)
            algorithm_label(s.replace("topk:matched", f"topk:{ratio:g}") if ratio else s)
            for s in reseed
        }
    )
    say(
        f"consensus: {topology} (weights={weights or 'default'}, γ={topo.gamma:.4g}), problem {problem}, "
        f"{dtype}, seeds {', '.join(map(str, seeds))}, backend {backend}, {len(plan)} runs on seed 0"
        + (f", top-k matched ratio {ratio:g}" if ratio else "")
    )
    screen_bits = (
        float(sweep_bits)
        if sweep_bits is not None
        else (budgets[-2] if len(budgets) > 1 else max_bits)
    )
    screening = any(item["swept"] for item in plan) and screen_bits < max_bits and finalists > 0
    counter = {"k": 0, "total": len(plan)}

    def one(item: Dict, bits_limit: float, stage: str, seed: int) -> Dict:
        with switch:
            values = run_peers(
                topo,
                consensus_curve,
                problem,
                item["spec"],
                max_steps,
                bits_limit,
                budgets,
                DIVERGE_FACTOR,
                stop_relative,
                seed,
                dtype,
                models_files.get(seed),
                True,
                backend=backend,
            )
        outcome = _same_on_every_peer(values, item["spec"])
        history = outcome["history"]
        cells = cells_for(history, budgets, outcome["stop"], stage, outcome["floor"])
        result = {
            **item,
            "gamma": spec_gamma(item["spec"], topo),
            "history": history,
            "stage": stage,
            "stop": outcome["stop"],
            "seconds": outcome["seconds"],
            "budgets": cells,
            "reach": reach_cells(history),
            "seed": seed,
            "dtype": dtype,
            "floor": outcome["floor"],
            "steps": history[-1]["step"],
            "bits_per_peer": history[-1]["bits_per_peer"],
            "file": run_file(item["spec"], seed),
        }
        counter["k"] += 1
        say(
            f"  [{counter['k']:2d}/{counter['total']}] s{seed} {stage:<6s} {item['spec']:<44s} {result['steps']:6d} "
            f"steps {result['bits_per_peer']:10.4g} bits  rel. error "
            f"{fmt_err(history[-1]['error'] / history[0]['error']):>9s}  {outcome['stop']:<9s} "
            f"{outcome['seconds']:6.1f} s"
        )
        return result

    results = []
    for item in plan:
        stage = "screen" if screening and item["swept"] else "full"
        results.append(one(item, screen_bits if stage == "screen" else max_bits, stage, 0))
    if screening:
        # Rerun to the full length the `finalists` gammas of each swept algorithm that are best at the
        # screening budget (diverged ones excluded); the others keep their screening curves.
        labels = list(dict.fromkeys(r["label"] for r in results if r["stage"] == "screen"))
        chosen = []
        for label in labels:
            ranked = sorted(
                (
                    r
                    for r in results
                    if r["label"] == label and r["stage"] == "screen" and r["stop"] != "diverged"
                ),
                key=lambda r: _screen_key(r, screen_bits),
            )
            chosen += [r for r in ranked[:finalists] if r["stop"] == "max_bits"]
        counter["total"] += len(chosen)
        for result in chosen:
            results[results.index(result)] = one(
                {k: result[k] for k in ("label", "spec", "swept")}, max_bits, "full", 0
            )
    summary = summarize(results, budgets)
    for seed in seeds[1:]:
        again = [
            entry
            for label, entry in summary.items()
            if reseed_labels is None or label in reseed_labels
        ]
        counter["total"] += len(again)
        for entry in again:
            spec = entry["plot_spec"]
            results.append(
                one(
                    {"label": entry["runs"][0]["label"], "spec": spec, "swept": entry["swept"]},
                    max_bits,
                    "full",
                    seed,
                )
            )
    seconds = time.perf_counter() - started
    table = format_table(summary, budgets)
    say(
        f"\nrelative error at bit budgets (per peer, seed 0), {topology} {problem}, {seconds:.0f} s:\n{table}\n"
    )
    record = {
        "topology": topology,
        "weights": weights or "default",
        "gamma_topology": topo.gamma,
        "problem": problem,
        "backend": backend,
        "budgets": list(budgets),
        "gammas": list(gammas),
        "sweep": sweep,
        "topk_ratio": ratio,
        "max_bits": max_bits,
        "max_steps": max_steps,
        "seconds": seconds,
        "screen_bits": screen_bits if screening else None,
        "finalists": finalists if screening else None,
        "seeds": list(seeds),
        "dtype": dtype,
        "stop_relative": stop_relative,
        "out": str(out),
        "results": results,
        "summary": summary,
        "table": table,
        "command": command
        or "python -m experiments.consensus " + " ".join(map(shlex.quote, sys.argv[1:])),
    }
    if write and is_root:
        write_outputs(record, out, plots)
    return record


def _screen_key(result: Dict, screen_bits: float):
    """Rank screening runs: those that stopped early at their target first (fewest bits), then by
    the error at the screening budget."""
    if result["stop"] in ("reached", "floor"):
        return (0, result["bits_per_peer"])
    cell = cells_for(result["history"], [screen_bits], result["stop"], "full")[screen_bits]
    return (1, cell["row"]["error"] if cell["status"] == "ok" else math.inf)
