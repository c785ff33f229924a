"""`python -m experiments.train`: the `gossip-train` program (`gossip_powersgd.cli.train`) run
from a checkout; it names this module in its help and error hints, so commands stay as they were."""

import functools

from gossip_powersgd.cli import train as _program
from gossip_powersgd.cli.train import build_parser, resolve

#: `gossip_powersgd.cli.train.run` and `.main`, as `python -m experiments.train`.
run = functools.partial(_program.run, module="experiments.train")
main = functools.partial(_program.main, module="experiments.train")

__all__ = ["build_parser", "main", "resolve", "run"]

if __name__ == "__main__":
    main()
