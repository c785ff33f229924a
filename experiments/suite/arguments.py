"""The suite's command line (`driver.main` parses it)."""

from __future__ import annotations

import argparse
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The CLI: which page to make, and how long to train."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.suite",
        description="Reproduce the paper's claims with real runs.",
    )
    parser.add_argument("what", choices=("privacy",))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny problem (seconds)",
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
        help="epochs of each run (15 without DP, dp_sweep.DP_EPOCHS with DP)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="privacy: runs at once (processes)")
    return parser
