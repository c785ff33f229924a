"""`python -m experiments.plot`: the `gossip-plot` program (`gossip_powersgd.cli.plot`) run from a
checkout; it names this module in its help, so a checkout's commands stay as they were."""

from pathlib import Path
from typing import List, Optional

from gossip_powersgd.cli import plot as _program
from gossip_powersgd.cli.plot import FIGURES, plot_runs, read_run

MODULE = "experiments.plot"


def run(argv: Optional[List[str]] = None) -> List[Path]:
    """`gossip_powersgd.cli.plot.run`, as `python -m experiments.plot`."""
    return _program.run(argv, module=MODULE)


def main(argv: Optional[List[str]] = None) -> None:
    """`gossip_powersgd.cli.plot.main`, as `python -m experiments.plot`."""
    _program.main(argv, module=MODULE)


__all__ = ["FIGURES", "main", "plot_runs", "read_run", "run"]

if __name__ == "__main__":
    main()
