"""The suite's CLI: `python -m experiments.suite training|gamma|consensus|privacy|dynamic [options]`."""

from __future__ import annotations

import shlex
import sys
from typing import List, Optional

from .arguments import build_parser
from .gamma import run_gamma
from .tables import ROOT
from .training import run_training


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m experiments.suite WHAT ...`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = "python -m experiments.suite " + " ".join(shlex.quote(a) for a in argv)
    # Pages go to experiments/results/ only when --out names it: the default is under runs/.
    out = args.out or (ROOT / "runs" / ("suite-quick" if args.quick else "suite"))
    if args.what == "training" and args.render_only:
        from .training_render import render_training

        render_training(out, command)
    elif args.what == "training":
        run_training(
            out,
            args.quick,
            epochs=args.epochs or 60,
            seeds=args.seeds,
            choco_seeds=args.choco_seeds,
            sweep_epochs=args.sweep_epochs,
            wide_epochs=args.wide_epochs,
            reference_epochs=args.reference_epochs,
            eval_every=args.eval_every,
            command=command,
        )
    elif args.what == "privacy":
        from .privacy import run_privacy

        run_privacy(out, args.quick, epochs=args.epochs, command=command, jobs=args.jobs)
    elif args.what == "dynamic":
        from .dynamic import TRAINING_EPOCHS, run_dynamic

        run_dynamic(out, args.quick, epochs=args.epochs or TRAINING_EPOCHS, command=command)
    elif args.what == "gamma":
        run_gamma(out, args.quick, epochs=args.epochs or 5, command=command)
    else:
        from experiments import consensus

        if args.quick:  # one small instance (seconds), not the report
            return consensus.main(
                [
                    "--topology",
                    "ring:4",
                    "--problem",
                    "matrix:20",
                    "--steps",
                    "40",
                    "--out",
                    str(out / "consensus"),
                ]
            )
        return consensus.main(["--report", "--out", str(out)])
    return 0
