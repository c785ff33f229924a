"""`python -m experiments.consensus`: see the package docstring, or `--help`."""

from gossip_powersgd.launch import main_guard

from experiments.consensus.cli import main

if __name__ == "__main__":
    main_guard(main)
