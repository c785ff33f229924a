"""The suite's CLI: `python -m experiments.suite training|gamma|consensus|privacy|dynamic [options]`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import List, Optional

from .gamma import run_gamma
from .tables import ROOT
from .training import run_training

def build_parser() -> argparse.ArgumentParser:
    """The CLI: which page to make, and how long to train."""
    parser = argparse.ArgumentParser(prog="python -m experiments.suite",
                                     description="Reproduce the paper's claims with real runs.")
    parser.add_argument("what", choices=("training", "gamma", "consensus", "privacy", "dynamic"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny problem (synthetic logistic regression, ring:4, 1 epoch), seconds")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default runs/suite, or runs/suite-quick with --quick; "
                             "the committed pages: --out experiments/results)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs of each run (training: 60, the CNN rows; gamma: 5; dynamic: 30; "
                             "privacy: 4)")
    parser.add_argument("--seeds", type=int, default=3, help="training: seeds of the ring:8 iid rows")
    parser.add_argument("--choco-seeds", type=int, default=1,
                        help="training: seeds of the Choco rows on iid (at most --seeds; each costs ~4x "
                             "an exact-gossip run)")
    parser.add_argument("--sweep-epochs", type=int, default=10, help="training: epochs of the γ sweep")
    parser.add_argument("--wide-epochs", type=int, default=30, help="training: epochs of the wide model")
    parser.add_argument("--reference-epochs", type=int, default=100,
                        help="training: epochs of the reference runs (none if not above --epochs)")
    parser.add_argument("--render-only", action="store_true",
                        help="training: draw the page and plots again from the run's "
                             "CSVs in --out, without training")
    parser.add_argument("--eval-every", type=int, default=2,
                        help="training: epochs between evaluations (the curves' resolution)")
    return parser


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
        run_training(out, args.quick, epochs=args.epochs or 60, seeds=args.seeds,
                     choco_seeds=args.choco_seeds, sweep_epochs=args.sweep_epochs,
                     wide_epochs=args.wide_epochs, reference_epochs=args.reference_epochs,
                     eval_every=args.eval_every, command=command)
    elif args.what == "privacy":
        from .privacy import run_privacy

        run_privacy(out, args.quick, epochs=args.epochs or 4, command=command)
    elif args.what == "dynamic":
        from .dynamic import TRAINING_EPOCHS, run_dynamic

        run_dynamic(out, args.quick, epochs=args.epochs or TRAINING_EPOCHS, command=command)
    elif args.what == "gamma":
        run_gamma(out, args.quick, epochs=args.epochs or 5, command=command)
    else:
        from experiments import consensus

        if args.quick:  # one small instance (seconds), not the report
            return consensus.main(["--topology", "ring:4", "--problem", "matrix:20", "--steps", "40",
                                   "--out", str(out / "consensus")])
        return consensus.main(["--report", "--out", str(out)])
    return 0
