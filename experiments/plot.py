"""`python -m experiments.plot`: the `gossip-plot` program (`gossip_powersgd.cli.plot`) run from a
checkout; it names this module in its help, so a checkout's commands stay as they were."""

import functools

from gossip_powersgd.cli import plot as _program
from gossip_powersgd.cli.plot import FIGURES, plot_runs, read_run

#: `gossip_powersgd.cli.plot.run` and `.main`, as `python -m experiments.plot`.
run = functools.partial(_program.run, module="experiments.plot")
main = functools.partial(_program.main, module="experiments.plot")

__all__ = ["FIGURES", "main", "plot_runs", "read_run", "run"]

if __name__ == "__main__":
    main()
