"""Long-run check: many PowerGossip steps on the consensus problem, watching the average and memory.

    python -m experiments.long_run [--steps 10000] [--topology ring:8] [--out experiments/results/long_run.md]
    mpiexec -n 8 python -m experiments.long_run --backend mpi

Each peer holds a 100x100 float32 N(0,1) matrix (seeded 42 + rank). Every `--log-every` steps it
logs, as JSON lines: the consensus error, the relative drift of the average over peers from its
starting value (||mean_t - mean_0|| / ||mean_0||, which gossip must keep at float rounding), and this
process's resident memory. The summary states whether drift stayed <= 1e-6 and memory grew < 5 %
from step 100 to the last step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

import topologies
from gossip_powersgd import PowerGossip, consensus_distance
from gossip_powersgd.launch import BACKENDS, main_guard, resolve_backend, run_peers
from gossip_powersgd.metrics import parameter_average
from gossip_powersgd.utils import atomic_write

from experiments.engine.provenance import page_commit

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

DRIFT_LIMIT = 1e-6
MEMORY_GROWTH_LIMIT = 0.05


def resident_bytes() -> int:
    """This process's resident set size, from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peer(comm: Comm, steps: int, log_every: int, rank: int):
    """One peer's long run: PowerGossip steps, a record every `log_every` steps (and at 1, 100)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(42 + comm.rank)
    x = [torch.randn(100, 100, generator=g)]
    start_mean = parameter_average(x, comm)
    gossip = PowerGossip(x, comm, rank=rank)
    records = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        gossip.step()
        if step % log_every == 0 or step in (1, 100):
            mean = parameter_average(x, comm)
            drift = float((mean - start_mean).norm() / start_mean.norm())
            records.append(
                {
                    "step": step,
                    "consensus_distance": consensus_distance(x, comm),
                    "average_drift": drift,
                    "rss_bytes": resident_bytes(),
                    "seconds": time.perf_counter() - started,
                }
            )
    return records


def summarize(records, steps: int):
    """The checks: the largest drift of the average, and memory growth from step 100 to the end."""
    by_step = {r["step"]: r for r in records}
    base = by_step.get(100, records[0])
    last = records[-1]
    growth = (last["rss_bytes"] - base["rss_bytes"]) / base["rss_bytes"]
    max_drift = max(r["average_drift"] for r in records)
    return {
        "steps": steps,
        "max_average_drift": max_drift,
        "drift_ok": max_drift <= DRIFT_LIMIT,
        "rss_step_100_mb": base["rss_bytes"] / 1e6,
        "rss_last_mb": last["rss_bytes"] / 1e6,
        "rss_growth": growth,
        "memory_ok": growth < MEMORY_GROWTH_LIMIT,
        "final_consensus_distance": last["consensus_distance"],
        "seconds": last["seconds"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--topology", default="ring:8")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=500)
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="local: one thread per peer; mpi: one peer per rank, under mpiexec "
        "(default: mpi when launched by mpiexec)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write a markdown summary here")
    args = parser.parse_args(argv)
    if args.steps < 100:
        raise ValueError("--steps must be >= 100 (memory is compared from step 100 on)")
    topology = topologies.parse(args.topology)
    args.backend = resolve_backend(args.backend)
    commit = page_commit()  # the code as it is when the run starts
    records = run_peers(
        topology, peer, args.steps, args.log_every, args.rank, backend=args.backend
    ).get(0)
    if records is None:  # not rank 0 of an MPI job: rank 0 reports
        return 0
    summary = summarize(records, args.steps)
    for r in records:
        print(json.dumps(r))
    print(json.dumps(summary))
    if args.out:
        command = "python -m experiments.long_run " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        lines = [
            "# Long run: average drift and memory over many PowerGossip steps",
            "",
            f"Command: `{command}` (backend {args.backend}, rank-0 process), "
            f"{datetime.date.today().isoformat()}, {summary['seconds']:.0f} s, commit {commit}.",
            "",
            f"Setup: {args.topology}, PowerGossip rank {args.rank}, 100x100 float32 N(0,1) per peer.",
            "",
            "| check | measured | limit | ok |",
            "|---|---|---|---|",
            f"| max relative drift of the average | {summary['max_average_drift']:.2e} | {DRIFT_LIMIT:g} | "
            f"{'yes' if summary['drift_ok'] else 'NO'} |",
            f"| resident memory, step 100 -> {args.steps} | {summary['rss_step_100_mb']:.1f} MB -> "
            f"{summary['rss_last_mb']:.1f} MB ({100 * summary['rss_growth']:+.2f} %) | +5 % | "
            f"{'yes' if summary['memory_ok'] else 'NO'} |",
            "",
            f"Final consensus distance: {summary['final_consensus_distance']:.3e}.",
            "",
            "| step | consensus distance | average drift | RSS (MB) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['step']} | {r['consensus_distance']:.3e} | {r['average_drift']:.2e} | "
            f"{r['rss_bytes'] / 1e6:.1f} |"
            for r in records
        ]
        atomic_write(args.out, "\n".join(lines) + "\n")
    return 0 if summary["drift_ok"] and summary["memory_ok"] else 1


if __name__ == "__main__":
    main_guard(main)
