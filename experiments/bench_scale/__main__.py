"""`python -m experiments.bench_scale`: see the package docstring."""

from gossip_powersgd.launch import main_guard

from .driver import main

main_guard(main)
