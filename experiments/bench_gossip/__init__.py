"""Benchmark PowerGossip (rank 1) against exact gossip on the zoo's ResNet-20 and VGG-16 shapes.

    python -m experiments.bench_gossip --all            # everything -> runs/bench_gossip.md
    python -m experiments.bench_gossip --all --before 6df8d52 --out experiments/results/bench_gossip.md
                                                        # the page, with 6df8d52's PowerGossip beside
    python -m experiments.bench_gossip --model vgg16 --topology torus:2x4 --backend local --naive
    python -m experiments.bench_gossip --model resnet20 --backend mpi --out /tmp/r20.md
                                                        # launches `mpiexec -n 8` by itself
    mpiexec -n 8 .venv/bin/python -m experiments.bench_gossip --backend mpi   # or launch it yourself

What is measured, for every model x topology x backend:

* bytes per peer per step, from the transport's counters (`comm.stats.bytes_sent`), for exact gossip
  and PowerGossip, checked step by step against the algorithms' own `bytes_per_step()`;
* time per step, split into compute and communication by the algorithm's accumulators
  (`time_total`, `time_communication`, `time_compute`);
* with `--naive`, the same PowerGossip with `batch_neighbors=False`, in blocks interleaved with the
  batched blocks (order alternating A B B A ...) so that drift of the shared machine cancels;
* with `--before COMMIT`, COMMIT's PowerGossip (its `powergossip.py` and the `algorithms/` modules
  it imports, read with git: `experiments.commit_code`) as one more batched variant in the same
  interleaved blocks: this tree's compute and step time over COMMIT's, whether the bytes of every
  step are equal, and whether every peer's final parameters are bit-identical;
* memory bandwidth, measured in the same run by large tensor copies (GB/s = 2 x bytes / time): all
  peers copying at once (the in-situ configuration), and one thread alone (the isolated one);
* compute efficiency = 3 x (bytes of the compressed matrices) / (compute time per half-step x
  bandwidth): a half-step must at least read every compressed matrix once (the products) and read and
  write it once (the update). Measured twice: in situ (the 8-peer run, against the concurrent-copy
  bandwidth) and isolated (one peer's half-steps with every other peer idle, against a one-thread
  copy; that peer talks to a loopback transport, so its compute is the real code path and none of
  it waits for a CPU that another peer holds).

`--all` also times the individual kernels PowerGossip calls on the largest VGG-16 group (and the
first formulation's and per-column alternatives to them).

Modules: `shapes` (the parameter sets), `measure` (per-peer, isolated and kernel measurements),
`summary` (per-setting numbers), `report` (the markdown page), `record` (raw JSON, machine),
`driver` (settings, backends, child processes, the CLI).
"""

from .driver import build_parser, drive_all, main, run, run_settings
from .measure import (
    BenchConfig,
    copy_bandwidth,
    isolated_benchmark,
    kernel_benchmark,
    loopback_communicator,
    peer_benchmark,
    run_block,
)
from .record import machine_description, raw_json
from .report import render_markdown
from .shapes import MODELS, count_params, make_params, model_shapes, resnet20_shapes, vgg16_shapes
from .summary import summarize_isolated, summarize_setting

__all__ = [
    "BenchConfig",
    "MODELS",
    "build_parser",
    "copy_bandwidth",
    "count_params",
    "drive_all",
    "isolated_benchmark",
    "kernel_benchmark",
    "loopback_communicator",
    "machine_description",
    "main",
    "make_params",
    "model_shapes",
    "peer_benchmark",
    "raw_json",
    "render_markdown",
    "resnet20_shapes",
    "run",
    "run_block",
    "run_settings",
    "summarize_isolated",
    "summarize_setting",
    "vgg16_shapes",
]
