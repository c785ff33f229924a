"""The suite's CLI: `python -m experiments.suite privacy [options]`."""

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
    from .privacy import run_privacy

    run_privacy(out, args.quick, epochs=args.epochs, command=command, jobs=args.jobs)
    return 0
