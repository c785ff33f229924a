"""`python -m experiments.privacy_attacks`: see `driver`, or `--help`."""

import sys

from experiments.privacy_attacks.driver import main

if __name__ == "__main__":
    sys.exit(main())
