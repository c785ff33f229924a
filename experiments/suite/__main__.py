"""`python -m experiments.suite`: see the package docstring, or `--help`."""

import sys

from experiments.suite.driver import main

if __name__ == "__main__":
    sys.exit(main())
