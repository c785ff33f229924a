"""`python -m experiments.bench_gossip`: see the package docstring, or `--help`."""

from experiments.bench_gossip.driver import main

if __name__ == "__main__":
    main()
