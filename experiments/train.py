"""`python -m experiments.train`: the `gossip-train` program (`gossip_powersgd.cli.train`) run
from a checkout; it names this module in its help and error hints, so commands stay as they were."""

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
