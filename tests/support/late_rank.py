"""Run a module as torchrun's worker, rank RANK of it SECONDS late (still importing, as on a
loaded machine), for tests/comm/test_torch.py:

    python tests/support/late_rank.py RANK SECONDS MODULE ARGS...
"""

from __future__ import annotations

import os
import runpy
import sys
import time

if __name__ == "__main__":
    rank, seconds, module, *argv = sys.argv[1:]
    if os.environ.get("RANK") == rank:
        time.sleep(float(seconds))
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
