"""The suite's CLI: `python -m experiments.suite consensus|dynamic [options]`."""

from __future__ import annotations

import shlex
import sys
from typing import List, Optional

from .arguments import build_parser
from experiments.engine.provenance import ROOT


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m experiments.suite WHAT ...`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = "python -m experiments.suite " + " ".join(shlex.quote(a) for a in argv)
    # Pages go to experiments/results/ only when --out names it: the default is under runs/.
    out = args.out or (ROOT / "runs" / ("suite-quick" if args.quick else "suite"))
    if args.what == "dynamic":
        from .dynamic import TRAINING_EPOCHS, run_dynamic

        run_dynamic(out, args.quick, epochs=args.epochs or TRAINING_EPOCHS, command=command)
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
