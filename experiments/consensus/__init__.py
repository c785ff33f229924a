"""The consensus experiment of the PowerGossip paper (Vogels, Karimireddy and Jaggi, 2020, sec. 5).

The problem: every peer of a topology holds tensors (seeded per peer) and the peers only gossip:
no gradients, no training. Averaging is the whole task, so the error, the mean over peers of
||x_i - x_bar||^2_F (`consensus_distance`, which gossip drives to 0 while keeping x_bar fixed),
measures how fast an algorithm averages per step and per bit sent; tables and plots give it
relative to its initial value. Mixing weights W: the topology's (uniform 1/(degree+1) on static
graphs; `--weights` for others); schedules and directed graphs are refused (no consensus step).

    python -m experiments.consensus                                   # ring:8, 100x100, exact + PowerGossip
    python -m experiments.consensus --sweep                           # + Choco / DeepSqueeze, gamma swept
    python -m experiments.consensus --topology torus:4x4 --problem spectral:alpha=1 --sweep --seeds 0 1 2
    python -m experiments.consensus --algorithms exact "choco:compressor=sign,gamma=0.1" --dtype float32
    mpiexec -n 8 python -m experiments.consensus --backend mpi        # one peer per rank, same numbers
    python -m experiments.consensus --report --out experiments/results   # the committed page

Problems (see `problems`): `matrix` (100x100 N(0,1); `matrix:N`, `matrix:RxC`), `cnn` (N(0,1)
tensors shaped like MNIST-1D's `cnn1d` parameters), `spectral:alpha=A` (singular values decaying
as k^-A), `lowrank:r=R,sigma=S` (shared rank-R structure plus noise), `offset:beta=B` (`matrix`
plus a component shared by all peers) and `models:epoch=E` (real `cnn1d` models after E epochs of
D-PSGD on MNIST-1D, Dirichlet(0.1); trained first, cached). The state is float64 by default
(`--dtype`); exact gossip and PowerGossip send the state's dtype (8 bytes per float64 float).

Algorithms (the defaults): exact gossip (every peer sends its full tensors to each neighbour) and
PowerGossip rank 1, 2 and 4 with warm-started power iteration, and rank 1 restarted from a random
start every step; these use the topology's consensus step gamma = 2/(lambda_min+lambda_max) of I-W,
untuned. With `--sweep` also the compressed-gossip baselines Choco-Gossip and DeepSqueeze, each
with a sign, a top-k and a rank-1 compressor; these need a tuned gamma: give it in the spec or pass
`--sweep` to run every value of `--gammas` (on seed 0; other `--seeds` rerun each algorithm at its
best gamma on seed 0 at the largest budget). `topk:matched` is top-k with k matched to PowerGossip
rank 1's floats per message on this problem (measured, e.g. 0.01 for a 100x100 matrix); top-k also
sends int32 indices, which the transport counts.

Budgets: bits per peer are 8 x the transport's count of training bytes (`comm.stats.bytes_sent`),
never a formula. The table compares algorithms at matched bits: each run's error at exactly 1e5, 1e6
and 1e7 bits per peer (`--budgets`), log-log interpolated between the recorded steps around the
budget (`matched.error_at_bits`), and the bits to reach relative error 1e-2 and 1e-4
(`matched.bits_to_reach`). A run goes until it has sent more than the largest budget, diverges,
reaches its dtype's precision floor (100 eps^2 mean ||x_i||^2; values within 10x are marked), or,
with `--stop-relative`, that relative error. When sweeping, every gamma first runs to the second
largest budget and the best `--finalists` are rerun to the largest.

Outputs, written atomically into --out (default runs/consensus/<topology>_<problem>; with
`--report`, --out is the folder of the page consensus.md and of its instances' folders
consensus/<topology>_<problem>, default runs/consensus-report; the committed page is made with
`--report --out experiments/results`): `curves.jsonl.gz` (every run's curve, one gzipped JSON
line per run: its name, and step, bits_per_peer, error per recorded step), `table.csv` (every run's
absolute and relative error at every budget, bits to each target, best gamma marked),
`summary.json`, `error_vs_bits.png` and `error_vs_steps.png` (relative error, one line per
algorithm at its best gamma, seed 0); the report adds `winner_map.png`. Every argument, every
algorithm spec (each built once on every peer), the problem's size (at most `problems.MAX_FLOATS`
floats per peer, and within the machine's memory) and the output directory are checked before the
first run, each bad one refused in one line.

Modules: `problems` (the problems), `models` (training the models problem), `measure` (one run's
curve, the runs to make, matched-bit cells, the best gamma per budget), `matched` (interpolation),
`compare` (winner map), `report` (tables, CSV, plots, run files), `page`/`page_text` (the report
page), `driver` (runs on every peer, seeds), `cli` (the CLI and the report's instances).
"""

from .cli import build_parser, main, report_settings
from .compare import (
    REACH_TARGETS,
    heat_map,
    powergossip_ratio,
    reach_cells,
    winner_cell,
    winner_text,
)
from .driver import REPORT_CONFIGS, parse_topology, run_experiment
from .matched import bits_to_reach, error_at_bits
from .measure import (
    BASELINES,
    BUDGETS,
    COARSE_GAMMAS,
    DEFAULT_GAMMAS,
    DIVERGE_FACTOR,
    DTYPES,
    FLOOR_MARGIN,
    FLOOR_ULPS,
    STEP_CAP,
    STOP_RELATIVE,
    UNTUNED,
    WINNER_SPECS,
    budget_rows,
    cells_for,
    consensus_curve,
    eval_steps,
    expand,
    matched_ratio,
    precision_floor,
    summarize,
)
from .page import write_report
from .problems import (
    SEED_BASE,
    cnn1d_shapes,
    make_problem,
    parse_problem,
    problem_shapes,
    spectral_values,
)
from .report import (
    CURVES,
    DEFAULT_OUT,
    REPORT_OUT,
    REPORT_PATH,
    SCRATCH_OUT,
    default_out,
    format_table,
    load_record,
    plot,
    read_curves,
    table_csv,
    write_outputs,
)

__all__ = [
    "BASELINES",
    "BUDGETS",
    "CURVES",
    "REPORT_OUT",
    "read_curves",
    "COARSE_GAMMAS",
    "DEFAULT_GAMMAS",
    "DEFAULT_OUT",
    "DIVERGE_FACTOR",
    "DTYPES",
    "FLOOR_MARGIN",
    "FLOOR_ULPS",
    "REACH_TARGETS",
    "REPORT_CONFIGS",
    "REPORT_PATH",
    "SCRATCH_OUT",
    "SEED_BASE",
    "STEP_CAP",
    "STOP_RELATIVE",
    "UNTUNED",
    "WINNER_SPECS",
    "bits_to_reach",
    "budget_rows",
    "build_parser",
    "cells_for",
    "cnn1d_shapes",
    "consensus_curve",
    "default_out",
    "error_at_bits",
    "eval_steps",
    "expand",
    "format_table",
    "heat_map",
    "load_record",
    "main",
    "make_problem",
    "matched_ratio",
    "parse_problem",
    "parse_topology",
    "plot",
    "powergossip_ratio",
    "precision_floor",
    "problem_shapes",
    "reach_cells",
    "report_settings",
    "run_experiment",
    "spectral_values",
    "summarize",
    "table_csv",
    "winner_cell",
    "winner_text",
    "write_outputs",
    "write_report",
]
