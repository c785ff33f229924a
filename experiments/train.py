"""`python -m experiments.train`: the `gossip-train` program, run from a checkout.

The program lives in `gossip_powersgd.cli.train`; this wrapper only names itself in the help and
the error hints, so a checkout's commands and their output stay as they were.
"""

from typing import Any, Dict, List, Optional

from gossip_powersgd.cli import train as _program
from gossip_powersgd.cli.train import build_parser, resolve

MODULE = "experiments.train"


def run(argv: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    """`gossip_powersgd.cli.train.run`, as `python -m experiments.train`."""
    return _program.run(argv, module=MODULE)


def main(argv: Optional[List[str]] = None) -> None:
    """`gossip_powersgd.cli.train.main`, as `python -m experiments.train`."""
    _program.main(argv, module=MODULE)


__all__ = ["build_parser", "main", "resolve", "run"]

if __name__ == "__main__":
    main()
