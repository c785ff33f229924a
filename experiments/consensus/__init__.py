"""The consensus experiment of the PowerGossip paper (Vogels, Karimireddy and Jaggi, 2020, sec. 5).

The problem: every peer of a topology holds random tensors (N(0,1) entries, float32, seeded
42 + rank) and the peers only gossip: no gradients, no training. Averaging is the whole task, so
the error, the mean over peers of ||x_i - x_bar||^2_F (`consensus_distance`, which gossip drives to
0 while keeping x_bar fixed), measures how fast an algorithm averages per step and per bit sent.
Mixing weights W default to uniform: 1/(degree+1) for a peer itself and each neighbour.

    python -m experiments.consensus                                   # ring:8, 100x100, exact + PowerGossip
    python -m experiments.consensus --sweep                           # + Choco / DeepSqueeze, gamma swept
    python -m experiments.consensus --topology torus:4x4 --problem cnn --sweep
    python -m experiments.consensus --algorithms exact "choco:compressor=sign,gamma=0.1"
    mpiexec -n 8 python -m experiments.consensus --backend mpi        # one peer per rank, same numbers
    python -m experiments.consensus --report                          # experiments/results/consensus.md

Problems: `matrix` (one 100x100 matrix per peer; `matrix:20` or `matrix:20x30` for other sizes) and
`cnn` (tensors shaped like the parameters of the MNIST-1D `cnn1d` model, channels 32, input length
40: conv (32,1,5), (32,32,5), (32,32,5), their biases, linear (10,128) and its bias).

Algorithms (the defaults): exact gossip (every peer sends its full tensors to each neighbour) and
PowerGossip rank 1, 2 and 4 with warm-started power iteration, and rank 1 restarted from a random
start every step; these use the topology's consensus step gamma = 2/(lambda_min+lambda_max) of I-W,
untuned. With `--sweep` also the compressed-gossip baselines Choco-Gossip and DeepSqueeze, each
with a sign, a top-k and a rank-1 compressor; these need a tuned gamma: give it in the spec or pass
`--sweep` to run every value of `--gammas`, and the budget table then reports, for every bit budget,
the best gamma's error. `topk:matched` is top-k with k matched to PowerGossip rank 1's floats per
message on this problem (measured, e.g. 0.01 for a 100x100 matrix); top-k also sends int32 indices,
which the transport counts.

Budgets: bits per peer are 8 x the transport's count of training bytes (`comm.stats.bytes_sent`),
never a formula, and the table compares algorithms at 1e5, 1e6 and 1e7 bits per peer (`--budgets`).
A run goes until it has sent more than the largest budget (or diverges). When sweeping, every gamma
first runs to the second largest budget and the 2 best (`--finalists`) are rerun to the largest.

Outputs, written atomically into --out (default runs/consensus/<topology>_<problem>; the report's
go to experiments/results/consensus/<topology>_<problem>):
`runs/<run>.jsonl` (one row per recorded step: step, bits_per_peer, error), `table.csv` (every
run's error at every budget, best gamma marked), `summary.json`, `error_vs_bits.png` and
`error_vs_steps.png` (one line per algorithm, at its best gamma). The error is recorded at all early
steps, on a geometric grid after, and at the last step within each budget, which is what the table
reports: the error of the last step whose cumulative bits per peer are <= the budget, "—" if the
algorithm's first step already exceeds it.

Modules: `measure` (problems, one run's curve, the best gamma per budget), `report` (tables, CSV,
plots, run files), `page` (the report page), `driver` (runs on every peer, the CLI).
"""

from .cli import build_parser, main, report_settings
from .compare import REACH_TARGETS, heat_map, powergossip_ratio, reach_cells, winner_cell, winner_text
from .driver import REPORT_CONFIGS, parse_topology, run_experiment
from .matched import bits_to_reach, error_at_bits
from .measure import (BASELINES, BUDGETS, COARSE_GAMMAS, DEFAULT_GAMMAS, DIVERGE_FACTOR, DTYPES, FLOOR_MARGIN,
                      FLOOR_ULPS, STEP_CAP, STOP_RELATIVE, UNTUNED, WINNER_SPECS, budget_rows, cells_for,
                      consensus_curve, eval_steps, expand, matched_ratio, precision_floor, summarize)
from .page import write_report
from .problems import (SEED_BASE, cnn1d_shapes, make_problem, parse_problem, problem_shapes,
                       spectral_values)
from .report import (DEFAULT_OUT, REPORT_PATH, SCRATCH_OUT, default_out, format_table, load_record, plot,
                     table_csv, write_outputs)

__all__ = [
    "BASELINES", "BUDGETS", "COARSE_GAMMAS", "DEFAULT_GAMMAS", "DEFAULT_OUT", "DIVERGE_FACTOR", "DTYPES",
    "FLOOR_MARGIN", "FLOOR_ULPS", "REACH_TARGETS", "REPORT_CONFIGS", "REPORT_PATH", "SCRATCH_OUT",
    "SEED_BASE", "STEP_CAP", "STOP_RELATIVE", "UNTUNED", "WINNER_SPECS", "bits_to_reach", "budget_rows",
    "build_parser", "cells_for", "cnn1d_shapes", "consensus_curve", "default_out", "error_at_bits",
    "eval_steps", "expand", "format_table", "heat_map", "load_record", "main", "make_problem",
    "matched_ratio", "parse_problem", "parse_topology", "plot", "powergossip_ratio", "precision_floor",
    "problem_shapes", "reach_cells", "report_settings", "run_experiment", "spectral_values", "summarize",
    "table_csv", "winner_cell", "winner_text", "write_outputs", "write_report",
]
