"""A dataset function for the fault tests: rank 1 calls sys.exit(0) while loading it, as user code
may, before its communicator exists (the config's validation builds the dataset)."""

import os
import sys

import numpy as np


def exit_on_rank_1(seed=0):
    if os.environ.get("PMI_RANK", os.environ.get("RANK")) == "1":
        sys.exit(0)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((80, 5))
    y = (x[:, 0] > 0).astype(np.int64)
    return x[:60], y[:60], x[60:], y[60:]
