"""`python -m experiments PAGE [--quick] [--jobs N] [--render-only] [--out DIR]`: see
`experiments.engine.cli` (no PAGE, or --list: the pages)."""

import sys

from experiments.engine.cli import main
from experiments.pages import pages

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], pages))
