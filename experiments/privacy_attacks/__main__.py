"""`python -m experiments.privacy_attacks`: see `driver`, or `--help`."""

from gossip_powersgd.launch import main_guard

from experiments.privacy_attacks.driver import main

if __name__ == "__main__":
    main_guard(main)  # a failure while writing the page (a full disk): one line, not a traceback
