"""The benchmark's driver: settings from the CLI, every peer through `run_peers` (in one process or
under mpiexec), the `--all` run of child processes, and the output files."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from gossip_powersgd.launch import launched_by_mpiexec, main_guard, mpi_world, run_peers
from gossip_powersgd.utils import atomic_write

from .measure import (
    BenchConfig,
    before_powergossip,
    even_steps,
    isolated_benchmark,
    kernel_benchmark,
    peer_benchmark,
)
from .record import machine_description, raw_json
from .report import render_kernels, render_markdown
from .shapes import MODELS
from .summary import summarize_setting

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm
    from topologies import AnyTopology

ROOT = Path(__file__).resolve().parents[2]
# Pages go to experiments/results/ only when --out names it; by default under runs/ (git-ignored).
DEFAULT_OUT = ROOT / "runs" / "bench_gossip.md"
DEFAULT_TOPOLOGIES = ("ring:8", "torus:2x4")
# torus:2x4 has degree 3 (the dimension of size 2 wraps onto the same neighbour), so --all adds an
# 8-peer graph of degree 4: the circulant C8(1, 2) (Watts-Strogatz with k=4 and no rewiring).
ALL_TOPOLOGIES = ("ring:8", "torus:2x4", "small_world:8:4:0")
# Measured PowerGossip steps per variant, warm-up steps per variant, and measured exact-gossip steps
# (after one warm-up step when more than one): VGG-16 is cut short to keep `--all` near 10 minutes
# on a loaded 2-core machine.
DEFAULT_STEPS = {"resnet20": 40, "vgg16": 8, "vgg16_bn": 2}
WARMUP_STEPS = {"resnet20": 2, "vgg16": 1, "vgg16_bn": 0}
EXACT_STEPS = {"resnet20": 4, "vgg16": 1, "vgg16_bn": 1}


def _configs(args) -> List[BenchConfig]:
    models = ["resnet20", "vgg16"] if args.model == "all" else [args.model]
    topologies_ = _topology_list(args.topology)
    out = []
    for model in models:
        steps = even_steps(args.steps if args.steps is not None else DEFAULT_STEPS[model])
        reps = (
            args.reps
            if args.reps is not None
            else (4 if model == "resnet20" else max(1, steps // 2))
        )
        reps = max(1, min(reps, steps // 2))
        for spec in topologies_:
            out.append(
                BenchConfig(
                    model=model,
                    topology=spec,
                    backend=args.backend,
                    steps=steps,
                    reps=reps,
                    naive=args.naive,
                    isolated=not args.no_isolated,
                    bytes_only=args.bytes_only,
                    exact_steps=EXACT_STEPS[model],
                    warmup=WARMUP_STEPS[model],
                    before=args.before,
                )
            )
    return out


def _topology_list(values: Optional[List[str]]) -> List[str]:
    if not values:
        return list(DEFAULT_TOPOLOGIES)
    out = []
    for v in values:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


def _mpi_peer(comm: Comm, cfg: BenchConfig, topology: AnyTopology) -> Dict[str, Any]:
    """One rank's part of a setting under MPI: its own measurements, then rank 0 measures the
    isolated half-steps while the others sleep in a barrier (the MPI transport's waits poll with
    sleeps, so waiting ranks leave the cores alone); every rank gets every peer's measurements."""
    mine = peer_benchmark(comm, cfg)
    isolated = None
    if cfg.isolated and not cfg.bytes_only:
        comm.barrier()
        if comm.rank == 0:
            isolated = isolated_benchmark(cfg, topology)
        comm.barrier()
    return {"peers": _gather_json(comm, mine), "isolated": isolated}


def run_settings(configs: List[BenchConfig], backend: str) -> Optional[List[Dict[str, Any]]]:
    """Every setting on every peer through `run_peers`; the results on rank 0, None elsewhere.

    backend "local": the peers are threads of this process, and the isolated peer runs in the main
    thread after the cluster has finished. backend "mpi": this process is one rank (collective)."""
    import torch

    import topologies

    torch.set_num_threads(1)
    results = []
    for cfg in configs:
        topology = topologies.parse(cfg.topology)
        started = time.perf_counter()
        if backend == "mpi":
            mine = next(
                iter(
                    run_peers(
                        topology, _mpi_peer, cfg, topology, backend="mpi", timeout=1800
                    ).values()
                )
            )
            if mpi_world()[0] != 0:
                continue
            peers, iso = mine["peers"], mine["isolated"]
        else:
            values = run_peers(topology, peer_benchmark, cfg, backend="local", timeout=1800)
            peers = [values[rank] for rank in sorted(values)]
            iso = isolated_benchmark(cfg, topology) if cfg.isolated and not cfg.bytes_only else None
        summary = summarize_setting(cfg, peers, iso)
        summary["seconds"] = time.perf_counter() - started
        results.append({"summary": summary, "raw": {"peers": peers, "isolated": iso}})
        _progress(summary)
    return results if mpi_world()[0] == 0 else None


def _gather_json(comm: Comm, obj) -> List[Any]:
    """Every peer's `obj`, through the communicator's raw all-gather (JSON bytes, padded)."""
    data = json.dumps(obj).encode()
    sizes = [
        int.from_bytes(b, "little") for b in comm.allgather_bytes(len(data).to_bytes(8, "little"))
    ]
    padded = comm.allgather_bytes(data + b" " * (max(sizes) - len(data)))
    return [json.loads(p[:size]) for p, size in zip(padded, sizes)]


def _progress(summary: Dict[str, Any]) -> None:
    v = summary["variants"]["batched"]
    line = (
        f"[bench] {summary['model']} {summary['topology']} {summary['backend']}: "
        f"bytes ratio {v['bytes_ratio']:.0f}x"
    )
    if "compute" in v:
        line += f", batched compute {v['compute'] * 1e3:.1f} ms/step"
    if "speedup" in summary:
        line += f", naive/batched compute {summary['speedup']['compute']:.2f}x"
    if "isolated" in summary:
        iso = summary["isolated"]["variants"]["batched"]["all"]
        line += f", isolated efficiency {iso['efficiency'] * 100:.0f}%"
    line += f" ({summary['seconds']:.0f} s)"
    print(line, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.bench_gossip",
        description="PowerGossip vs exact gossip: bytes, time, efficiency.",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="run everything (both models, ring:8, torus:2x4 and a degree-4 graph, local "
        "and mpi, with --naive and the kernel diagnosis) and write --out",
    )
    p.add_argument(
        "--model",
        default="all",
        choices=MODELS + ("all",),
        help="parameter set (all = resnet20 and vgg16)",
    )
    p.add_argument(
        "--topology",
        action="append",
        metavar="SPEC",
        help=f"topology spec, repeatable or comma-separated (default {','.join(DEFAULT_TOPOLOGIES)})",
    )
    p.add_argument("--backend", default="local", choices=("local", "mpi"))
    p.add_argument(
        "--steps",
        type=int,
        help="measured PowerGossip steps per variant "
        f"(default {DEFAULT_STEPS['resnet20']} for resnet20, {DEFAULT_STEPS['vgg16']} for vgg16)",
    )
    p.add_argument(
        "--reps",
        type=int,
        help="interleaved blocks the steps are split into "
        "(default 4 for resnet20, steps/2 for vgg16)",
    )
    p.add_argument(
        "--naive",
        action="store_true",
        help="also run batch_neighbors=False, interleaved with the batched blocks",
    )
    p.add_argument(
        "--no-isolated", action="store_true", help="skip the isolated single-peer measurement"
    )
    p.add_argument("--bytes-only", action="store_true", help="2 steps, bytes only (no timing)")
    p.add_argument("--kernels", action="store_true", help="only the kernel diagnosis")
    p.add_argument(
        "--before",
        metavar="COMMIT",
        help="also time COMMIT's PowerGossip (batched, with its own algorithms/ helper modules, "
        "read with git) in blocks interleaved with this tree's, and compare bytes and final "
        "parameters (a section of the page; with --all on both backends)",
    )
    p.add_argument(
        "--out",
        help="write the markdown here (and the raw numbers next to it as .json); "
        "default: print it (with --all: runs/bench_gossip.md; the committed "
        "page: --out experiments/results/bench_gossip.md)",
    )
    p.add_argument("--json", help=argparse.SUPPRESS)  # internal: raw results for the --all driver
    return p


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    from shutil import which

    found = which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "mpiexec not found next to the python or on PATH (pip install mpich)"
        )
    return found


def _run_child(command: List[str], timeout: float) -> None:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    print("[bench] " + " ".join(shlex.quote(c) for c in command), file=sys.stderr, flush=True)
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise RuntimeError(
            f"benchmark child did not finish within {timeout:.0f} s: {command}"
        ) from None
    except KeyboardInterrupt:
        os.killpg(process.pid, signal.SIGTERM)
        raise
    if code != 0:
        raise RuntimeError(f"benchmark child failed (exit {code}): {' '.join(command)}")


def _child_json(args_list: List[str], mpi: bool, timeout: float, tmp: Path, name: str) -> Any:
    path = tmp / f"{name}.json"
    command = [sys.executable, "-m", "experiments.bench_gossip", *args_list, "--json", str(path)]
    if mpi:
        command = [_mpiexec(), "-n", "8", *command]
    _run_child(command, timeout)
    return json.loads(path.read_text())


def drive_all(args, command: str) -> int:
    out = Path(args.out) if args.out else DEFAULT_OUT
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t0 = time.perf_counter()
    machine = machine_description()
    topo = [
        "--topology",
        ",".join(args.topology and _topology_list(args.topology) or ALL_TOPOLOGIES),
    ]
    extra = [
        *(["--steps", str(args.steps)] if args.steps else []),
        *(["--reps", str(args.reps)] if args.reps else []),
        *(["--before", args.before] if args.before else []),
    ]
    with tempfile.TemporaryDirectory(prefix="bench_gossip.") as tmpdir:
        tmp = Path(tmpdir)
        kernels = _child_json(["--kernels"], False, 600, tmp, "kernels")
        results = _child_json(
            ["--model", "all", *topo, "--backend", "local", "--naive", *extra],
            False,
            1800,
            tmp,
            "local",
        )
        results += _child_json(
            ["--model", "all", *topo, "--backend", "mpi", "--naive", *extra], True, 1800, tmp, "mpi"
        )
        results += _child_json(
            ["--model", "vgg16_bn", "--topology", "ring:8", "--backend", "local", "--bytes-only"],
            False,
            600,
            tmp,
            "bn",
        )
    seconds = time.perf_counter() - t0
    machine_end = machine_description()
    text = render_markdown(command, results, machine, kernels, started, seconds, machine_end)
    raw = {
        "command": command,
        "date": started,
        "seconds": seconds,
        "machine": machine,
        "machine_end": machine_end,
        "kernels": kernels,
        "settings": [r["summary"] for r in results],
        "raw": [r["raw"] for r in results],
    }
    atomic_write(out.with_suffix(".json"), raw_json(raw))
    atomic_write(out, text + "\n")
    print(f"[bench] wrote {out} and {out.with_suffix('.json')} ({seconds:.0f} s)", file=sys.stderr)
    return 0


def run(argv: Optional[List[str]] = None) -> int:
    """`python -m experiments.bench_gossip ...`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = "python -m experiments.bench_gossip " + " ".join(shlex.quote(a) for a in argv)
    if args.steps is not None and args.steps < 2:
        raise ValueError(
            f"--steps must be >= 2 (one right and one left half-step), got {args.steps}"
        )
    if args.reps is not None and args.reps < 1:
        raise ValueError(f"--reps must be >= 1, got {args.reps}")
    if args.before is not None:
        if args.bytes_only or args.kernels:
            raise ValueError("--before times two PowerGossips: drop --bytes-only / --kernels")
        before_powergossip(args.before)  # a one-line error now, before any peer starts
    if args.all:
        if launched_by_mpiexec():
            raise ValueError("--all launches mpiexec by itself: run it without mpiexec")
        return drive_all(args, command.strip())
    if args.kernels:
        import torch

        torch.set_num_threads(1)
        result = kernel_benchmark()
        if args.json:
            atomic_write(Path(args.json), json.dumps(result))
        else:
            print("\n".join(render_kernels(result)))
        return 0
    configs = _configs(args)
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t0 = time.perf_counter()
    if args.backend == "mpi":
        if not launched_by_mpiexec():
            # Re-launch ourselves on as many ranks as the topologies have peers.
            import topologies

            sizes = {topologies.parse(c.topology).size for c in configs}
            if len(sizes) != 1:
                raise ValueError(
                    f"backend mpi runs one job: all topologies must have the same "
                    f"number of peers, got {sorted(sizes)}"
                )
            child = [
                _mpiexec(),
                "-n",
                str(sizes.pop()),
                sys.executable,
                "-m",
                "experiments.bench_gossip",
                *argv,
            ]
            _run_child(child, 3600)
            return 0
        results = run_settings(configs, "mpi")
        if results is None:
            return 0
    else:
        results = run_settings(configs, "local")
    if args.json:
        atomic_write(Path(args.json), json.dumps(results))
        return 0
    machine = machine_description()
    text = render_markdown(
        command.strip(), results, machine, None, started, time.perf_counter() - t0
    )
    if args.out:
        out = Path(args.out)
        atomic_write(
            out.with_suffix(".json"),
            raw_json(
                {
                    "command": command.strip(),
                    "date": started,
                    "machine": machine,
                    "settings": [r["summary"] for r in results],
                    "raw": [r["raw"] for r in results],
                }
            ),
        )
        atomic_write(out, text + "\n")
    else:
        print(text)
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    """Run the CLI; an error is one line on stderr and a non-zero exit, on every rank."""
    main_guard(run, argv)
