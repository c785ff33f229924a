"""`python -m experiments.bench_backends`: one training run on one machine under each backend
(`local`: every peer a thread of one process; `mpi`: one process per peer under mpiexec; `torch`:
one process per peer under torchrun, gloo), the same config and seed, interleaved repetitions.

Reports wall time (start to exit, including each process's start-up: the torch import, the data)
and CPU time (user + system of all the run's processes) per backend, and checks that the three
give the same final model (summary.json's model_sha256). Writes the page to --out (default
runs/bench_backends.md; the committed page: --out experiments/results/bench_backends.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from gossip_powersgd.utils import atomic_write

from experiments.engine.provenance import page_commit

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BACKENDS = ("local", "mpi", "torch")


def command(backend: str, config: str, peers: int, overrides: List[str], out: Path) -> List[str]:
    train = [
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        config,
        "--quiet",
        "--set",
        f"backend={backend}",
        "--set",
        f"out_dir={out}",
    ]
    for item in overrides:
        train += ["--set", item]
    if backend == "mpi":
        return [str(BIN / "mpiexec"), "-n", str(peers), sys.executable, *train]
    if backend == "torch":
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(peers), *train]
    return [sys.executable, *train]


def one(backend: str, args, scratch: Path, rep: int) -> Dict:
    out = scratch / f"{backend}-{rep}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        command(backend, args.config, args.peers, args.set, out),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=args.timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} run failed: {done.stderr.strip()[-500:]}")
    summary = json.loads((out / "summary.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "backend": backend,
        "rep": rep,
        "wall_s": wall,
        "cpu_s": cpu,
        "train_wall_s": summary["wall_time_s"],
        "sha": tuple(summary["model_sha256"]),
        "acc": summary["final_test_acc_avg_model"],
    }


def render(
    rows: List[Dict], args, argv: List[str], seconds: float, load: tuple, commit: str
) -> str:
    def med(backend, key):
        return statistics.median(r[key] for r in rows if r["backend"] == backend)

    same = len({r["sha"] for r in rows}) == 1
    lines = [
        "# One machine: in-process peers vs mpiexec vs torchrun",
        "",
        f"Command: `python -m experiments.bench_backends {' '.join(map(shlex.quote, argv))}`  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} ({seconds:.0f} s) · "
        f"commit {commit} · {os.cpu_count()} cores shared with other jobs (load average "
        f"{load[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end): absolute times move with the "
        "load; the backends ran interleaved, so their ratios saw the same machine.",
        "",
        f"Config `{args.config}` with {' '.join(args.set) or 'no overrides'}, {args.peers} peers, "
        f"{args.reps} repetitions per backend (medians). Wall: the whole command, start-up "
        "included; training: the run's own wall_time_s (after start-up); CPU: user + system of "
        "all its processes.",
        "",
        "| backend | wall (s) | training (s) | CPU (s) | wall ÷ local |",
        "|---|---|---|---|---|",
    ]
    for b in BACKENDS:
        lines.append(
            f"| {b} | {med(b, 'wall_s'):.1f} | {med(b, 'train_wall_s'):.1f} | "
            f"{med(b, 'cpu_s'):.1f} | {med(b, 'wall_s') / med('local', 'wall_s'):.2f} |"
        )
    lines += [
        "",
        f"Same final models on every backend and repetition (every peer's model_sha256): "
        f"**{'yes' if same else 'no'}**; averaged-model accuracy {rows[0]['acc']:.4f}.",
        "",
        "Each run: "
        + "; ".join(
            f"{r['backend']} #{r['rep']}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU"
            for r in rows
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_backends", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", default="experiments/configs/ring8_mnist1d_powergossip.yaml")
    parser.add_argument("--peers", type=int, default=8, help="the config's number of peers")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, e.g. epochs=3",
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_backends.md")
    args = parser.parse_args(argv)
    load, commit = os.getloadavg(), page_commit()  # the code as it is when the runs start
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(args.reps):
            order = BACKENDS if rep % 2 == 0 else BACKENDS[::-1]  # interleaved, alternating order
            for backend in order:
                rows.append(one(backend, args, Path(scratch), rep))
                print(
                    f"{backend} #{rep}: {rows[-1]['wall_s']:.1f} s wall, {rows[-1]['cpu_s']:.1f} s CPU",
                    flush=True,
                )
    atomic_write(args.out, render(rows, args, argv, time.perf_counter() - started, load, commit))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
