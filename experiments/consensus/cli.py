"""`python -m experiments.consensus`: the CLI, and the report (every instance of REPORT_CONFIGS)."""

from __future__ import annotations

import argparse
import ast
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from gossip_powersgd.launch import resolve_backend
from gossip_powersgd.utils import check_writable_dir

from .driver import REPORT_CONFIGS, REPORT_SEEDS, run_experiment
from .measure import (
    BASELINES,
    BUDGETS,
    COARSE_GAMMAS,
    DEFAULT_GAMMAS,
    DTYPES,
    STEP_CAP,
    STOP_RELATIVE,
    UNTUNED,
    WINNER_SPECS,
)
from .page import write_report
from .problems import VALID, parse_problem
from .report import REPORT_OUT, REPORT_PATH, ROOT, SCRATCH_OUT, default_out, load_record

#: Where the report's trained models are cached (git-ignored; regenerated when missing).
REPORT_MODELS = SCRATCH_OUT / "models"


def report_settings(kind: str) -> Dict:
    """The algorithms, γ grid, finalists and seeds of one kind of report instance (see REPORT_CONFIGS)."""
    if kind == "full":
        return {
            "algorithms": UNTUNED + BASELINES,
            "gammas": COARSE_GAMMAS,
            "finalists": 1,
            "seeds": REPORT_SEEDS,
            "reseed": WINNER_SPECS,
        }
    return {
        "algorithms": WINNER_SPECS,
        "gammas": COARSE_GAMMAS,
        "finalists": 1,
        "seeds": REPORT_SEEDS,
        "reseed": None,
    }


def build_parser() -> argparse.ArgumentParser:
    """The CLI; its help describes the experiment (the package docstring)."""
    # The package's docstring, read from its source (the package imports this module)
    doc = ast.get_docstring(
        ast.parse((Path(__file__).parent / "__init__.py").read_text()), clean=False
    )
    summary, _, details = doc.partition("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m experiments.consensus",
        description=summary.replace("\n", " "),
        epilog=details,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--topology", default="ring:8", help="topology spec (default ring:8)")
    parser.add_argument(
        "--weights",
        default=None,
        help="mixing weights of a static graph: uniform (the default, 1/3 on a ring), "
        "metropolis, ...",
    )
    parser.add_argument(
        "--problem", default="matrix", help=f"one of {VALID} (default matrix, 100x100)"
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="float64",
        help="dtype of the consensus state and of what is sent (default float64; a "
        "float64 message costs 8 bytes per float)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="problem seeds (default 0); γ is swept on seed 0 and the others rerun "
        "each algorithm at its best γ on seed 0",
    )
    parser.add_argument(
        "--algorithms",
        nargs="+",
        metavar="SPEC",
        help="algorithm specs (default: exact gossip and PowerGossip rank 1, 2, 4 warm "
        "and rank 1 restart; with --sweep also Choco and DeepSqueeze with sign, "
        "topk:matched and lowrank:1)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="at most this many steps per run (default: until a run exceeds the largest budget)",
    )
    parser.add_argument(
        "--backend",
        choices=("local", "mpi"),
        default=None,
        help="local: one thread per peer; mpi: one peer per rank, under mpiexec "
        "(default: mpi when launched by mpiexec)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default runs/consensus/<topology>_<problem>; with "
        "--report the folder of the page, consensus.md, and of its data, "
        f"consensus/<instance>/: default {REPORT_OUT.relative_to(ROOT)}; the "
        f"committed page: --out {REPORT_PATH.parent.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="run Choco/DeepSqueeze specs without gamma at every value of --gammas",
    )
    parser.add_argument(
        "--gammas",
        type=float,
        nargs="+",
        default=list(DEFAULT_GAMMAS),
        help="the sweep's gamma grid (default: 8 log-spaced values in [1e-3, 1], then 1.4 and 2)",
    )
    parser.add_argument(
        "--sweep-bits",
        type=float,
        default=None,
        help="sweep stage 1: every gamma runs to this many bits per peer (default: the "
        "second largest budget); 0 = every gamma runs to the largest budget",
    )
    parser.add_argument(
        "--finalists",
        type=int,
        default=2,
        help="sweep stage 2: rerun this many best gammas (at --sweep-bits) to the "
        "largest budget (default 2)",
    )
    parser.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=list(BUDGETS),
        help="bit budgets per peer for the table (default 1e5 1e6 1e7)",
    )
    parser.add_argument(
        "--stop-relative",
        type=float,
        default=None,
        help=f"stop a run once its error is this fraction of the initial error "
        f"(default: never; the report uses {STOP_RELATIVE:g})",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="with --report: rebuild the report page from the saved outputs, run nothing",
    )
    parser.add_argument(
        "--missing",
        action="store_true",
        help="with --report: run only the instances that have no saved outputs yet "
        "and write the page from all of them",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="run every report instance (ring:8 and torus:4x4; the original and the "
        "added problems; 3 seeds) on the local backend, and write the page "
        "consensus.md into --out",
    )
    return parser


def _check(args) -> None:
    """Every argument, before anything runs (a bad one found after the runs would lose them)."""
    if args.steps is not None and not 1 <= args.steps <= STEP_CAP:
        raise ValueError(
            f"--steps must be in 1..{STEP_CAP}, got {args.steps} (without it a run stops "
            f"at {STEP_CAP} steps or once it has sent more than the largest budget, "
            "whichever comes first); use e.g. --steps 1000"
        )
    for flag, values in (("--budgets", args.budgets), ("--gammas", args.gammas)):
        bad = [v for v in values if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(
                f"{flag} must be finite and > 0, got {bad[0]:g}; e.g. {flag} "
                + ("1e5 1e6 1e7" if flag == "--budgets" else "0.01 0.1 1")
            )
    if args.finalists < 1:
        raise ValueError(f"--finalists must be >= 1, got {args.finalists}")
    if args.stop_relative is not None and not 0 < args.stop_relative < 1:
        raise ValueError(
            f"--stop-relative must be in (0, 1), got {args.stop_relative:g}: it is a "
            "fraction of the initial error, where every run starts (1 or more stops it at "
            f"once); e.g. --stop-relative {STOP_RELATIVE:g}"
        )
    if args.sweep_bits is not None and not args.sweep_bits >= 0:
        raise ValueError(
            f"--sweep-bits must be >= 0 (bits per peer; 0 runs every gamma to the largest "
            f"budget), got {args.sweep_bits:g}; e.g. --sweep-bits 1e6"
        )
    parse_problem(args.problem)


def _check_report_outputs(base: Path) -> None:
    """The report's output directories writable, before its first instance runs (each instance's
    `run_experiment` checks its own again, after its arguments)."""
    for folder in [default_out(t, p, base / "consensus") for t, p, _ in REPORT_CONFIGS] + [base]:
        check_writable_dir(folder, "choose another --out")


def _render_only(base: Path, command: str) -> int:
    data = base / "consensus"
    records = [
        load_record(default_out(t, p, data))
        for t, p, _ in REPORT_CONFIGS
        if (default_out(t, p, data) / "summary.json").exists()
    ]
    if not records:
        raise ValueError(
            f"--render-only: no saved outputs in {data}; run `python -m experiments.consensus "
            f"--report --out {base}` first, or name the folder that has them with --out"
        )
    ran = records[0].get("command", "python -m experiments.consensus --report")
    dates = sorted(r.get("finished", "") for r in records)
    seconds = records[0].get("report_seconds") or sum(r["seconds"] for r in records)
    path = write_report(
        records,
        ran,
        seconds,
        path=base / "consensus.md",
        date=dates[-1] or None,
        note=f" (this page re-rendered from its saved outputs by `{command}`; running "
        "time: the sum of its instances' times, without the page writing between "
        "them)",
    )
    print(f"wrote {path}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m experiments.consensus ...`: one experiment, or with --report the report page."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    _check(args)
    backend = resolve_backend(args.backend)
    sweep_bits = args.sweep_bits
    if sweep_bits == 0:
        sweep_bits = math.inf  # no screening: every gamma runs to the largest budget
    command = "python -m experiments.consensus " + " ".join(
        shlex.quote(str(a)) for a in (argv if argv is not None else sys.argv[1:])
    )
    if args.missing and not args.report:
        raise ValueError("--missing goes with --report")
    base = args.out if args.out is not None else REPORT_OUT
    if args.render_only:
        if not args.report:
            raise ValueError("--render-only goes with --report")
        return _render_only(base, command)
    if args.report:
        if backend != "local":
            raise ValueError("--report runs two topology sizes: use the local backend")
        _check_report_outputs(base)
        started = time.perf_counter()
        records = []
        note = (
            " (the instances saved by an earlier `python -m experiments.consensus --report` kept, "
            "the others run now; running time: the earlier instances' times plus this run's)"
            if args.missing
            else ""
        )
        earlier = 0.0
        for topology, problem, kind in REPORT_CONFIGS:
            out = default_out(topology, problem, base / "consensus")
            if args.missing and (out / "summary.json").exists():
                records.append(load_record(out))
                earlier += records[-1]["seconds"]
                continue
            settings = report_settings(kind)
            records.append(
                run_experiment(
                    topology,
                    problem,
                    args.algorithms or settings["algorithms"],
                    args.steps,
                    "local",
                    out,
                    True,
                    settings["gammas"],
                    args.budgets,
                    args.weights,
                    sweep_bits=sweep_bits,
                    finalists=settings["finalists"],
                    command=command,
                    seeds=settings["seeds"],
                    dtype=args.dtype,
                    stop_relative=args.stop_relative or STOP_RELATIVE,
                    reseed=settings["reseed"],
                    models_dir=REPORT_MODELS,
                )
            )
            # The page after every instance: an interrupted report still leaves a real page.
            write_report(
                records,
                command,
                earlier + time.perf_counter() - started,
                path=base / "consensus.md",
                note=note,
            )
        path = write_report(
            records,
            command,
            earlier + time.perf_counter() - started,
            path=base / "consensus.md",
            note=note,
        )
        print(f"wrote {path}")
        return 0
    run_experiment(
        args.topology,
        args.problem,
        args.algorithms,
        args.steps,
        backend,
        args.out,
        args.sweep,
        args.gammas,
        args.budgets,
        args.weights,
        sweep_bits=sweep_bits,
        finalists=args.finalists,
        plots=not args.no_plot,
        command=command,
        seeds=args.seeds,
        dtype=args.dtype,
        stop_relative=args.stop_relative,
    )
    return 0
