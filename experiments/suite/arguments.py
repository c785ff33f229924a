"""The suite's command line (`driver.main` parses it; `training_render` reads a page's command
back with it)."""

from __future__ import annotations

import argparse
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The CLI: which page to make, and how long to train."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.suite",
        description="Reproduce the paper's claims with real runs.",
    )
    parser.add_argument("what", choices=("training", "gamma", "consensus", "privacy", "dynamic"))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny problem (synthetic logistic regression, ring:4, 1 epoch), seconds",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/suite, or runs/suite-quick with --quick; "
        "the committed pages: --out experiments/results)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs of each run (training: 60, the CNN rows; gamma: 5; dynamic: 30; privacy: 15 without DP, dp_sweep.DP_EPOCHS with DP)",
    )
    parser.add_argument(
        "--seeds", type=int, default=3, help="training: seeds of the ring:8 iid rows"
    )
    parser.add_argument("--jobs", type=int, default=1, help="privacy: runs at once (processes)")
    parser.add_argument(
        "--choco-seeds",
        type=int,
        default=1,
        help="training: seeds of the Choco rows on iid (at most --seeds; each costs ~4x "
        "an exact-gossip run)",
    )
    parser.add_argument(
        "--sweep-epochs", type=int, default=10, help="training: epochs of the γ sweep"
    )
    parser.add_argument(
        "--wide-epochs", type=int, default=30, help="training: epochs of the wide model"
    )
    parser.add_argument(
        "--reference-epochs",
        type=int,
        default=100,
        help="training: epochs of the reference runs (none if not above --epochs)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="training: draw the page and plots again from the run's "
        "CSVs in --out, without training",
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=2,
        help="training: epochs between evaluations (the curves' resolution)",
    )
    return parser
