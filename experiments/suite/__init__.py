"""The paper's claims, reproduced by real training runs: one command per result page.

    python -m experiments.suite training      # runs/suite/training.{md,csv,png}
    python -m experiments.suite gamma         # runs/suite/gamma.{md,csv,png}
    python -m experiments.suite consensus     # runs/suite/consensus.md (experiments.consensus --report)
    python -m experiments.suite gamma --epochs 10 --out experiments/results   # the committed page
    python -m experiments.suite training --quick   # seconds, a smoke test (runs/suite-quick)
    python -m experiments.suite training --render-only --out DIR   # the page again from DIR's CSVs

Pages are written into experiments/results/ only when `--out experiments/results` says so; by
default they go under runs/ (git-ignored), so that no run overwrites a committed page by accident.

Every peer runs as a thread of this one process (`backend: local`, `LocalCluster`); the MPI
transport runs the very same algorithm code and its equality with the local one is tested in
tests/ (not here). All runs are sequential in one process, so MNIST-1D is generated once.

Projected wall time (per peer) = measured compute time (forward/backward/optimizer + the algorithm's
own compression arithmetic, means over peers) + projected communication time, where projected
communication = rounds x latency + critical_bytes / bandwidth, from the transport's counters
(`CommStats.projected_seconds`: one round per exchange costing its largest message, a ring
all-reduce 2(n-1) rounds of 1/n of the tensor). Latency 50 us, bandwidth 1 and 10 Gbit/s. Bytes
always come from the counters, never a formula.

Modules: `runs` (one training run on every peer, a row's numbers), `tables` (markdown and CSV from
the rows), `convergence` (rows compared at equal bytes, from their evaluation history), `noniid`
(the non-IID gap of PowerGossip's ranks and iterations), `training` (the training page's runs and
targets), `training_markdown` and `training_plots` (its markdown and pictures), `training_render`
(the page drawn again from a finished run's CSVs), `gamma`, `privacy`,
`dynamic` (one page each), `driver` (the CLI).
"""

from .driver import build_parser, main
from .gamma import gamma_verdict, run_gamma
from .runs import (
    BANDWIDTHS,
    BASE,
    LATENCY_S,
    QUICK_BASE,
    attempt,
    combine,
    communication_seconds,
    measurements,
    projected_seconds,
    run_one,
)
from .tables import (
    CSV_FIELDS,
    TABLE_HEADER,
    build_csv,
    build_table,
    exact_reference,
    header,
    ratio_to_exact,
)
from .convergence import (
    COLLAPSE_FRACTION,
    FIXED_TARGET,
    accuracy_at_mb,
    cheapest_to_reach,
    collapsed,
    common_budget,
    common_target,
    equal_bytes_table,
    first_reach,
)
from .noniid import NONIID_ROWS, closing_setting, gap_table, gap_verdict, gaps
from .training import (
    EXACT,
    GAMMA_GRID,
    POWERGOSSIP,
    ROWS,
    WIDE_MODEL,
    run_training,
    targets,
    training_plan,
)
from .training_markdown import training_page

__all__ = [
    "BANDWIDTHS",
    "BASE",
    "COLLAPSE_FRACTION",
    "CSV_FIELDS",
    "EXACT",
    "FIXED_TARGET",
    "GAMMA_GRID",
    "LATENCY_S",
    "NONIID_ROWS",
    "POWERGOSSIP",
    "QUICK_BASE",
    "ROWS",
    "TABLE_HEADER",
    "WIDE_MODEL",
    "accuracy_at_mb",
    "attempt",
    "build_csv",
    "build_parser",
    "build_table",
    "cheapest_to_reach",
    "closing_setting",
    "collapsed",
    "combine",
    "common_budget",
    "common_target",
    "communication_seconds",
    "equal_bytes_table",
    "exact_reference",
    "first_reach",
    "gamma_verdict",
    "gap_table",
    "gap_verdict",
    "gaps",
    "header",
    "main",
    "measurements",
    "projected_seconds",
    "ratio_to_exact",
    "run_gamma",
    "run_one",
    "run_training",
    "targets",
    "training_page",
    "training_plan",
]
