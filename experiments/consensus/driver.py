"""The consensus experiment's driver: run every algorithm (every γ when sweeping) on every peer,
through `run_peers` on either transport, and hand the record to the report; and the CLI."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from gossip_powersgd.launch import mpi_world, resolve_backend, run_peers

from .measure import (BASELINES, BUDGETS, DEFAULT_GAMMAS, STEP_CAP, UNTUNED, budget_rows, cells_for,
                      consensus_curve, expand, matched_ratio, problem_shapes, summarize)
from .page import write_report
from .report import (DEFAULT_OUT, REPORT_PATH, ROOT, default_out, fmt_err, format_table, load_record,
                     run_file, write_outputs)

#: (topology, problem) pairs of the report, in order.
REPORT_CONFIGS = (("ring:8", "matrix"), ("ring:8", "cnn"), ("torus:4x4", "matrix"), ("torus:4x4", "cnn"))


def _same_on_every_peer(values: Dict[int, Dict], spec: str) -> Dict:
    """Rank 0's outcome (this rank's under MPI), after checking every local peer recorded it too."""
    ranks = sorted(values)
    first = values[ranks[0]]
    for rank in ranks[1:]:
        if values[rank]["history"] != first["history"]:
            raise RuntimeError(f"{spec}: peer {rank} recorded a different history than peer {ranks[0]}")
    return first


def run_experiment(topology: str = "ring:8", problem: str = "matrix", algorithms: Optional[Sequence[str]] = None,
                   steps: Optional[int] = None, backend: str = "local", out: Optional[Path] = None,
                   sweep: bool = False, gammas: Sequence[float] = DEFAULT_GAMMAS,
                   budgets: Sequence[float] = BUDGETS, weights: str = "uniform",
                   max_bits: Optional[float] = None, sweep_bits: Optional[float] = None,
                   finalists: int = 2, log=print, write: bool = True, plots: bool = True,
                   command: Optional[str] = None) -> Dict:
    """Run every algorithm (every gamma when sweeping); write the outputs; return the summary.

    Sweeping is two-stage when `sweep_bits` (default: the second largest budget) is below
    `max_bits` (default: the largest budget): every gamma runs until it exceeds `sweep_bits`, then
    the `finalists` best gammas at `sweep_bits` are rerun to `max_bits`. So the table's columns up
    to `sweep_bits` are the best over the whole grid, the others the best over the finalists.

    Under `backend="mpi"` this is collective (every rank calls it, rank 0 writes and logs).
    """
    import topologies
    from gossip_powersgd.algorithms import spec_gamma

    torch.set_num_threads(1)
    backend = resolve_backend(backend)
    if backend == "mpi":
        from mpi4py import MPI  # noqa: F401 - initialises MPI, so that mpi_world() knows this rank

    topo = topologies.parse(topology, weights=weights)
    problem_shapes(problem)  # validate before anything runs
    budgets = tuple(sorted(float(b) for b in budgets))
    max_bits = float(max_bits if max_bits is not None else budgets[-1])
    max_steps = int(steps) if steps else STEP_CAP
    if algorithms is None:
        algorithms = UNTUNED + (BASELINES if sweep else ())
    out = Path(out) if out is not None else default_out(topology, problem)
    is_root = mpi_world()[0] == 0
    say = log if is_root else (lambda *a, **k: None)
    started = time.perf_counter()
    ratio = None
    if any("topk:matched" in a for a in algorithms):
        ratio = next(iter(run_peers(topo, matched_ratio, problem, backend=backend).values()))
    plan = expand(algorithms, sweep, gammas, ratio)
    say(f"consensus: {topology} (weights={weights}, γ={topo.gamma:.4g}), problem {problem}, "
        f"backend {backend}, {len(plan)} runs" + (f", top-k matched ratio {ratio:g}" if ratio else ""))
    screen_bits = float(sweep_bits) if sweep_bits is not None else (budgets[-2] if len(budgets) > 1 else max_bits)
    screening = any(item["swept"] for item in plan) and screen_bits < max_bits and finalists > 0
    counter = {"k": 0, "total": len(plan)}

    def one(item: Dict, bits_limit: float, stage: str) -> Dict:
        values = run_peers(topo, consensus_curve, problem, item["spec"], max_steps, bits_limit, budgets,
                           backend=backend)
        outcome = _same_on_every_peer(values, item["spec"])
        history = outcome["history"]
        cells = cells_for(history, budgets, outcome["stop"], stage)
        result = {**item, "gamma": spec_gamma(item["spec"], topo), "history": history, "stage": stage,
                  "stop": outcome["stop"], "seconds": outcome["seconds"], "budgets": cells,
                  "steps": history[-1]["step"], "bits_per_peer": history[-1]["bits_per_peer"],
                  "file": run_file(item["spec"])}
        counter["k"] += 1
        say(f"  [{counter['k']:2d}/{counter['total']}] {stage:<6s} {item['spec']:<46s} {result['steps']:6d} steps "
            f"{result['bits_per_peer']:10.4g} bits  error {fmt_err(history[-1]['error']):>9s}  "
            f"{outcome['stop']:<9s} {outcome['seconds']:6.1f} s")
        return result

    results = []
    for item in plan:
        stage = "screen" if screening and item["swept"] else "full"
        results.append(one(item, screen_bits if stage == "screen" else max_bits, stage))
    if screening:
        # Rerun to the full length the `finalists` gammas of each swept algorithm that are best at the
        # screening budget (diverged ones excluded); the others keep their screening curves.
        labels = list(dict.fromkeys(r["label"] for r in results if r["stage"] == "screen"))
        chosen = []
        for label in labels:
            ranked = sorted((r for r in results if r["label"] == label and r["stage"] == "screen"
                             and r["stop"] != "diverged"),
                            key=lambda r: budget_rows(r["history"], [screen_bits])[screen_bits]
                            .get("row", {"error": math.inf})["error"])
            chosen += ranked[:finalists]
        counter["total"] += len(chosen)
        for result in chosen:
            results[results.index(result)] = one({k: result[k] for k in ("label", "spec", "swept")},
                                                 max_bits, "full")
    summary = summarize(results, budgets)
    seconds = time.perf_counter() - started
    table = format_table(summary, budgets)
    say(f"\nerror at bit budgets (per peer), {topology} {problem}, {seconds:.0f} s:\n{table}\n")
    record = {"topology": topology, "weights": weights, "gamma_topology": topo.gamma, "problem": problem,
              "backend": backend, "budgets": list(budgets), "gammas": list(gammas), "sweep": sweep,
              "topk_ratio": ratio, "max_bits": max_bits, "max_steps": max_steps, "seconds": seconds,
              "screen_bits": screen_bits if screening else None, "finalists": finalists if screening else None,
              "out": str(out), "results": results, "summary": summary, "table": table,
              "command": command or "python -m experiments.consensus " + " ".join(map(shlex.quote, sys.argv[1:]))}
    if write and is_root:
        write_outputs(record, out, plots)
    return record


# --------------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    """The CLI; its help describes the experiment (the package docstring)."""
    from experiments import consensus as package

    summary, _, details = package.__doc__.partition("\n\n")
    parser = argparse.ArgumentParser(prog="python -m experiments.consensus",
                                     description=summary.replace("\n", " "), epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default="ring:8", help="topology spec (default ring:8)")
    parser.add_argument("--weights", default="uniform",
                        help="mixing weights: uniform (the paper's 1/3 on a ring), metropolis, ...")
    parser.add_argument("--problem", default="matrix", help="matrix (100x100), matrix:N, matrix:RxC or cnn")
    parser.add_argument("--algorithms", nargs="+", metavar="SPEC",
                        help="algorithm specs (default: exact gossip and PowerGossip rank 1, 2, 4 warm "
                             "and rank 1 restart; with --sweep also Choco and DeepSqueeze with sign, "
                             "topk:matched and lowrank:1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="at most this many steps per run (default: until a run exceeds the "
                             "largest budget)")
    parser.add_argument("--backend", choices=("local", "mpi"), default=None,
                        help="local: one thread per peer; mpi: one peer per rank, under mpiexec "
                             "(default: mpi when launched by mpiexec)")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--sweep", action="store_true",
                        help="run Choco/DeepSqueeze specs without gamma at every value of --gammas")
    parser.add_argument("--gammas", type=float, nargs="+", default=list(DEFAULT_GAMMAS),
                        help="the sweep's gamma grid (default: 8 log-spaced values in [1e-3, 1])")
    parser.add_argument("--sweep-bits", type=float, default=None,
                        help="sweep stage 1: every gamma runs to this many bits per peer (default: the "
                             "second largest budget); 0 = every gamma runs to the largest budget")
    parser.add_argument("--finalists", type=int, default=2,
                        help="sweep stage 2: rerun this many best gammas (at --sweep-bits) to the "
                             "largest budget (default 2)")
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS),
                        help="bit budgets per peer for the table (default 1e5 1e6 1e7)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    parser.add_argument("--render-only", action="store_true",
                        help="with --report: rebuild the report page from the saved outputs, run nothing")
    parser.add_argument("--report", action="store_true",
                        help=f"run ring:8 and torus:4x4, matrix and cnn, with --sweep, on the local "
                             f"backend, and write {REPORT_PATH.relative_to(ROOT)}")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m experiments.consensus ...`: one experiment, or with --report the report page."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if any(b <= 0 for b in args.budgets) or any(g <= 0 for g in args.gammas):
        raise ValueError("budgets and gammas must be > 0: give positive --budgets and --gammas")
    backend = resolve_backend(args.backend)
    if args.finalists < 1:
        raise ValueError(f"--finalists must be >= 1, got {args.finalists}")
    sweep_bits = args.sweep_bits
    if sweep_bits is not None and sweep_bits <= 0:
        sweep_bits = math.inf  # no screening: every gamma runs to the largest budget
    if args.render_only:
        if not args.report:
            raise ValueError("--render-only goes with --report")
        records = [load_record(default_out(t, p, DEFAULT_OUT)) for t, p in REPORT_CONFIGS]
        command = records[0].get("command", "python -m experiments.consensus --report")
        dates = sorted(r.get("finished", "") for r in records)
        path = write_report(records, command, sum(r["seconds"] for r in records), date=dates[-1] or None,
                            note=" (this page re-rendered from its saved outputs by "
                                 "`python -m experiments.consensus --report --render-only`)")
        print(f"wrote {path}")
        return 0
    if args.report:
        if backend != "local":
            raise ValueError("--report runs two topology sizes: use the local backend")
        command = "python -m experiments.consensus " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        started = time.perf_counter()
        records = []
        for topology, problem in REPORT_CONFIGS:
            records.append(run_experiment(topology, problem, args.algorithms, args.steps, "local",
                                          default_out(topology, problem, DEFAULT_OUT), True, args.gammas,
                                          args.budgets, args.weights, sweep_bits=sweep_bits,
                                          finalists=args.finalists, command=command))
        path = write_report(records, command, time.perf_counter() - started)
        print(f"wrote {path}")
        return 0
    command = "python -m experiments.consensus " + " ".join(
        shlex.quote(str(a)) for a in (argv if argv is not None else sys.argv[1:]))
    run_experiment(args.topology, args.problem, args.algorithms, args.steps, backend, args.out,
                   args.sweep, args.gammas, args.budgets, args.weights, sweep_bits=sweep_bits,
                   finalists=args.finalists, plots=not args.no_plot, command=command)
    return 0
