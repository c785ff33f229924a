"""What DP-SGD costs per step: per-example clipping engines side by side, and private training.

    python -m experiments.bench_dp [--reps 15] [--steps 20] [--big-batch 256] [--e2e-reps 5]
                                   [--e2e-epochs 3] [--out experiments/results/bench_dp.md]

(a) One peer, batch 32, MNIST-1D-shaped inputs (length 40, 10 classes), one torch thread, for
mlp:128,128 and cnn1d: a non-private step (zero_grad, forward, cross-entropy, backward, SGD step)
against the same step with the clipped sum of per-example gradients in place of the gradient
(`DPSGD.clipped_sum`, then divided by the batch) for each engine of `DPSGD(engine=...)`, and
against the whole private step (`DPSGD.privatize`: clip, noise, scale, accounting) for the
default engine and for Opacus' hooks (the engine before this bench). Repetitions are interleaved:
each one times `--steps` steps of every candidate in turn, so a burst of load from other jobs
falls on all of them alike (each repetition starting one candidate later than the one before),
and a ratio is the median over repetitions of each repetition's
own ratio. The non-private step and every engine's clipped sum again at batch
`--big-batch`.

(b) End to end: ring:8, cnn1d, MNIST-1D iid, batch 32, the in-process `LocalCluster` (the
trainer's `backend: local`), exact gossip and PowerGossip r1, without DP and with DP-SGD
(sigma = 1, C = 1) by the default engine and by Opacus' hooks; per step, from the 8th step to
the last, in interleaved repetitions of whole runs.

Times are CPU time of the measuring thread (a) and of the whole process, all peer threads (b):
on a machine shared with other jobs, CPU time leaves out the time a thread waits for a core,
which wall time does not. Wall times are reported beside them. Writes the page and a JSON file.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional
from unittest import mock

import torch
from torch.nn import functional as F

from experiments.bench_gossip.record import machine_description
from gossip_powersgd.utils import atomic_write, git_commit

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("mlp:128,128", "cnn1d")
ENGINES = ("ghost", "vmap", "ew", "hooks")
ALGORITHMS = (("exact gossip", "exact"), ("PowerGossip r1", "powergossip:rank=1,iters=1"))
BATCH = 32


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def median(values: List[float]) -> float:
    return statistics.median(values)


# ---- (a) one peer ---------------------------------------------------------------------------


def _one_peer_step(
    spec: str, dp_engine: Optional[str], full: bool, batch: int = BATCH, backward_only: bool = False
) -> Callable[[], None]:
    """One training step of a fresh model; with `dp_engine`, the clipped sum (or, `full`, the
    whole private step) replaces the gradient. `backward_only`: zero_grad, forward, loss and
    backward only (what the engine recorded is dropped), for the breakdown (c)."""
    from gossip_powersgd.privacy import DPSGD
    from gossip_powersgd.training.models import build_model

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 40, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)
    model = build_model(spec, input_shape=(40,), num_classes=10, seed=0)
    dp = None
    if dp_engine is not None:
        dp = DPSGD(1.0, 1.0, sample_rate=batch / 4000, shard_size=4000, engine=dp_engine)
        model = dp.wrap(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.01)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        if backward_only:
            if dp is not None:
                model.clear()
            return
        if dp is not None and full:
            dp.privatize(model, batch)
        elif dp is not None:  # the clipped sum divided by the expected batch, as privatize
            with torch.no_grad():
                for p, total in zip(params, dp.clipped_sum(model, batch, dp.expected_batch_size)):
                    p.grad = total
        optimizer.step()

    return step


def one_peer_candidates(spec: str, batch: int = BATCH) -> Dict[str, Callable[[], None]]:
    candidates = {"non-private": _one_peer_step(spec, None, False, batch)}
    for engine in ENGINES:
        candidates[f"clipped sum, {engine}"] = _one_peer_step(spec, engine, False, batch)
    if batch != BATCH:
        return candidates
    for engine in ("ghost", "hooks"):
        candidates[f"private step, {engine}"] = _one_peer_step(spec, engine, True)
    return candidates


def _rotated(candidates: Dict[str, Callable[[], None]], rep: int) -> list:
    """The candidates in the order of repetition `rep`: each starts one place later than in the
    one before, so none is always timed right after the same other one (on a loaded machine
    a fixed order put cnn1d's clipped sum above its whole private step, which does more)."""
    items = list(candidates.items())
    shift = rep % len(items)
    return items[shift:] + items[:shift]


def measure_one_peer(
    spec: str, reps: int, steps: int, batch: int = BATCH
) -> Dict[str, Dict[str, List[float]]]:
    """Per candidate, per repetition: ms per step, thread CPU time and wall time."""
    candidates = one_peer_candidates(spec, batch)
    for step in candidates.values():  # warm-up: allocator, autograd graphs, lazy imports
        for _ in range(5):
            step()
    times = {name: {"cpu": [], "wall": []} for name in candidates}
    for rep in range(reps):
        for name, step in _rotated(candidates, rep):
            cpu, wall = time.thread_time(), time.perf_counter()
            for _ in range(steps):
                step()
            times[name]["cpu"].append((time.thread_time() - cpu) / steps * 1e3)
            times[name]["wall"].append((time.perf_counter() - wall) / steps * 1e3)
    return times


#: The breakdown (c): the step's parts, measured like (a).
PARTS = {
    "forward + backward, non-private": (None, False, True),
    "forward + backward, ghost": ("ghost", False, True),
    "whole step, non-private": (None, False, False),
    "whole step, clipped sum ghost": ("ghost", False, False),
}


def count_operations(step: Callable[[], None]) -> int:
    """The tensor operations (ATen calls, the backward's included) one call of `step` issues."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    step()  # warm: lazy state of the optimizer and the engine
    with Count():
        step()
    return Count.calls


def measure_parts(spec: str, reps: int, steps: int) -> Dict[str, Any]:
    """(c): per part, per repetition, ms per step (thread CPU, wall); and operation counts."""
    candidates = {
        name: _one_peer_step(spec, engine, full, BATCH, backward_only)
        for name, (engine, full, backward_only) in PARTS.items()
    }
    operations = {
        name: count_operations(_one_peer_step(spec, *args))
        for name, args in (
            ("non-private", (None, False)),
            ("clipped sum, ghost", ("ghost", False)),
            ("private step, ghost", ("ghost", True)),
        )
    }
    for step in candidates.values():
        for _ in range(5):
            step()
    times = {name: {"cpu": [], "wall": []} for name in candidates}
    for rep in range(reps):
        for name, step in _rotated(candidates, rep):
            cpu, wall = time.thread_time(), time.perf_counter()
            for _ in range(steps):
                step()
            times[name]["cpu"].append((time.thread_time() - cpu) / steps * 1e3)
            times[name]["wall"].append((time.perf_counter() - wall) / steps * 1e3)
    return {"times": times, "operations": operations}


# ---- (b) end to end -------------------------------------------------------------------------


def _run(
    spec: str, engine: Optional[str], epochs: int, first: int, dataset: str
) -> Dict[str, float]:
    """One ring:8 training run; ms per step (process CPU, wall) from step `first` (at most half
    the run) to the last."""
    from gossip_powersgd import run
    from gossip_powersgd.privacy import DPSGD
    from gossip_powersgd.privacy import training as dp_training
    from gossip_powersgd.training.hooks import TrainingHooks

    from experiments.suite.runs import BASE

    overrides = dict(
        topology="ring:8",
        partition="iid",
        epochs=epochs,
        eval_every=epochs,
        warmup_epochs=0,
        algorithm=spec,
        comm_timeout=600.0,
        dataset=dataset,
    )
    if engine is not None:
        overrides.update(dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_delta=1e-5)
    marks: Dict[int, tuple] = {}

    class Marks(TrainingHooks):
        """Rank 0's process CPU and wall clocks at the end of every step."""

        def after_step(self, step: int, loss) -> None:
            marks[step + 1] = (time.process_time(), time.perf_counter())

    engine_class = functools.partial(DPSGD, engine=engine) if engine is not None else DPSGD
    with mock.patch.object(dp_training, "DPSGD", engine_class):
        run(dict(BASE, **overrides), hooks=lambda rank: [Marks()] if rank == 0 else [])
    last = max(marks)
    first = min(first, last // 2)
    steps = last - first
    return {
        "cpu": (marks[last][0] - marks[first][0]) / steps * 1e3,
        "wall": (marks[last][1] - marks[first][1]) / steps * 1e3,
        "steps": steps,
        "first": first,
    }


def measure_end_to_end(reps: int, epochs: int, dataset: str, first: int = 8) -> Dict[str, Any]:
    runs = {}
    for label, spec in ALGORITHMS:
        for engine in (None, "auto", "hooks"):
            runs[(label, engine)] = functools.partial(_run, spec, engine, epochs, first, dataset)
    times = {key: {"cpu": [], "wall": []} for key in runs}
    steps = 0
    for rep in range(reps):
        for key, run in runs.items():
            log(f"  end to end, rep {rep + 1}/{reps}: {key[0]}, DP {key[1] or 'off'}")
            result = run()
            times[key]["cpu"].append(result["cpu"])
            times[key]["wall"].append(result["wall"])
            steps, first = result["steps"], result["first"]
    return {"times": times, "steps": steps, "first": first}


# ---- the page -------------------------------------------------------------------------------


def _cell(values: List[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def _ratio(values: List[float], base: List[float]) -> float:
    """The median over repetitions of each repetition's ratio: a repetition runs its candidates
    back to back, so its ratio compares them under the same load from other jobs (the ratio of
    the medians mixes repetitions run minutes apart: 1.36x and 1.53x in two runs of one code)."""
    return median([v / b for v, b in zip(values, base)])


def render(args, one_peer, e2e, seconds: float, command: str, big=None, parts=None) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# What DP-SGD costs per step",
        "",
        f"Command: `{command}`",
        "",
        f"Date: {now} ({seconds:.0f} s), commit {git_commit()}. Machine: "
        f"{machine_description()['cpu']}, {os.cpu_count()} cores "
        f"shared with other jobs (load average {load:.1f} at the end), Python "
        f"{platform.python_version()}, torch {torch.__version__}, one torch thread. The machine "
        "was loaded by other jobs during the run: the figures are medians of interleaved "
        "repetitions (range in brackets), a ratio is the median of the repetitions' own "
        "ratios, and the times are CPU time (of the measuring thread in "
        "(a), of the whole process with its 8 peer threads in (b)), which leaves out the time a "
        "thread waits for a core; wall times are in the JSON file.",
        "",
        "Engines (`DPSGD(engine=...)`): **ghost** (the default, `auto`, for these models): "
        "each Linear / Conv1d layer's forward uses detached parameters, keeps its input and "
        "retains its output's gradient, so the backward computes no weight gradient and runs no "
        "Python; per-example norms from |a_i| |b_i| (Linear) or the im2col per-example "
        "gradients (Conv1d), then the clipped sum as one product per weight; **vmap**: "
        "torch.func per layer; **ew**, **hooks**: Opacus' GradSampleModule with expanded "
        "weights or hooks (hooks was the only engine before). *Clipped sum*: the step with the "
        "sum of clipped per-example gradients, divided by the expected batch, in place of the "
        "gradient; *private step*: the whole `privatize` (clip, Gaussian noise from the peer's "
        "ChaCha20 keystream, scale, accounting).",
        "",
        f"## (a) One peer, batch {BATCH}, ms per step",
        "",
        f"{args.reps} interleaved repetitions of {args.steps} steps each, after 5 warm-up steps; "
        "each repetition starts one candidate later than the one before.",
        "",
    ]
    names = list(next(iter(one_peer.values())))
    lines += ["| model | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for spec, times in one_peer.items():
        lines.append(f"| {spec} | " + " | ".join(_cell(times[n]["cpu"]) for n in names) + " |")
    lines += [
        "",
        "Ratios to the non-private step (CPU time; the median over the repetitions of each "
        "repetition's ratio, which compares steps timed back to back):",
        "",
        "| model | " + " | ".join(names[1:]) + " |",
        "|---" * len(names) + "|",
    ]
    for spec, times in one_peer.items():
        base = times["non-private"]["cpu"]
        lines.append(
            f"| {spec} | "
            + " | ".join(f"**{_ratio(times[n]['cpu'], base):.2f}×**" for n in names[1:])
            + " |"
        )
    if big:
        names = list(next(iter(big.values())))
        lines += [
            "",
            f"Batch {args.big_batch}, the same way (ratios to the non-private step):",
            "",
            "| model | non-private, ms | " + " | ".join(names[1:]) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        for spec, times in big.items():
            base = times["non-private"]["cpu"]
            lines.append(
                f"| {spec} | {_cell(base)} | "
                + " | ".join(
                    f"{_cell(times[n]['cpu'])} ms, **{_ratio(times[n]['cpu'], base):.2f}×**"
                    for n in names[1:]
                )
                + " |"
            )
    if parts:
        lines += _render_parts(args, parts)
    data = "MNIST-1D" if args.dataset == "mnist1d" else f"`{args.dataset}`"
    lines += [
        "",
        f"## (b) ring:8, cnn1d, {data} iid, local backend, ms per step",
        "",
        f"{args.e2e_reps} interleaved repetitions of whole runs of {args.e2e_epochs} "
        f"epochs; each times steps {e2e['first']} to {e2e['first'] + e2e['steps']} "
        "(process CPU time of all 8 peers per step, then wall time). DP-SGD: σ = 1, C = 1, "
        "Poisson batches of expected size 32.",
        "",
        "| algorithm | non-private | DP, ghost (the default) | DP, Opacus hooks | DP ghost ÷ "
        "non-private | DP hooks ÷ non-private | wall: non-private | wall: DP ghost | "
        "wall: DP hooks |",
        "|---" * 9 + "|",
    ]
    t = e2e["times"]
    for label, _ in ALGORITHMS:
        plain, ghost, hooks = t[(label, None)], t[(label, "auto")], t[(label, "hooks")]
        lines.append(
            f"| {label} | {_cell(plain['cpu'])} | {_cell(ghost['cpu'])} | {_cell(hooks['cpu'])} | "
            f"**{_ratio(ghost['cpu'], plain['cpu']):.2f}×** | "
            f"{_ratio(hooks['cpu'], plain['cpu']):.2f}× | {median(plain['wall']):.1f} | "
            f"{median(ghost['wall']):.1f} | {median(hooks['wall']):.1f} |"
        )
    lines += ["", "## Targets", ""]

    def status(ratio: float, bound: float, hooks: float) -> str:
        return f"{'MET' if ratio <= bound else 'MISSED'} ({ratio:.2f}×; Opacus' hooks {hooks:.2f}×)"

    for spec, times in one_peer.items():
        plain = times["non-private"]["cpu"]
        lines.append(
            f"- **The clipped sum at ≤ 1.5× a non-private step**, {spec}, batch {BATCH}: "
            + status(
                _ratio(times["clipped sum, ghost"]["cpu"], plain),
                1.5,
                _ratio(times["clipped sum, hooks"]["cpu"], plain),
            )
            + "."
        )
    for label, _ in ALGORITHMS:
        plain = t[(label, None)]["cpu"]
        lines.append(
            f"- **DP training at ≤ 2× the non-private time per step**, ring:8 cnn1d, "
            f"{label}: "
            + status(
                _ratio(t[(label, "auto")]["cpu"], plain),
                2.0,
                _ratio(t[(label, "hooks")]["cpu"], plain),
            )
            + "."
        )
    lines.append("")
    return "\n".join(lines)


def _render_parts(args, parts) -> List[str]:
    """(c): the step in parts, and the tensor operations per step."""
    lines = [
        "",
        f"## (c) Where the ghost engine's extra time goes, batch {BATCH}",
        "",
        f"The same way as (a) ({args.reps} interleaved repetitions of {args.steps} steps); "
        "*forward + backward*: zero_grad, forward, loss, backward (the ghost engine's "
        "records dropped); the rest of the whole step is, without DP, the SGD step, and, "
        "with the ghost engine, the clipped sum (norms, clip factors, one product per "
        "weight), the gradient assignment and the SGD step. *Operations*: ATen calls per "
        "step, the backward's included (counted by a TorchDispatchMode).",
        "",
        "| model | forward + backward: non-private | forward + backward: ghost | rest: "
        "non-private | rest: ghost | operations: non-private | operations: clipped sum, "
        "ghost | operations: private step, ghost | extra time per extra operation |",
        "|---" * 9 + "|",
    ]
    for spec, part in parts.items():
        t = {name: median(v["cpu"]) for name, v in part["times"].items()}
        ops = part["operations"]
        fb0, fb1 = t["forward + backward, non-private"], t["forward + backward, ghost"]
        rest0 = t["whole step, non-private"] - fb0
        rest1 = t["whole step, clipped sum ghost"] - fb1
        extra_ops = ops["clipped sum, ghost"] - ops["non-private"]
        per_op = (
            (t["whole step, clipped sum ghost"] - t["whole step, non-private"]) * 1e3 / extra_ops
            if extra_ops > 0
            else float("nan")
        )
        lines.append(
            f"| {spec} | {fb0:.3f} ms | {fb1:.3f} ms | {rest0:.3f} ms | {rest1:.3f} ms | "
            f"{ops['non-private']} | {ops['clipped sum, ghost']} | "
            f"{ops['private step, ghost']} | {per_op:.1f} µs |"
        )
    return lines


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_dp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--e2e-reps", type=int, default=5)
    parser.add_argument("--e2e-epochs", type=int, default=3)
    parser.add_argument(
        "--big-batch",
        type=int,
        default=256,
        help="(a) again at this batch size, without the private steps (0: skip)",
    )
    parser.add_argument(
        "--dataset",
        default="mnist1d",
        help="the end-to-end runs' dataset (inputs of length 40: cnn1d)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "runs/bench_dp.md",
        help="the page (default runs/bench_dp.md; the committed page: "
        "--out experiments/results/bench_dp.md)",
    )
    args = parser.parse_args(argv)
    if min(args.reps, args.steps, args.e2e_reps, args.e2e_epochs) < 1:
        parser.error("--reps, --steps, --e2e-reps and --e2e-epochs must be >= 1")
    command = "python -m experiments.bench_dp " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    torch.set_num_threads(1)
    started = time.perf_counter()
    one_peer = {}
    for spec in MODELS:
        log(f"one peer: {spec}")
        one_peer[spec] = measure_one_peer(spec, args.reps, args.steps)
    big = {}
    for spec in MODELS if args.big_batch else ():
        log(f"one peer: {spec}, batch {args.big_batch}")
        big[spec] = measure_one_peer(spec, args.reps, args.steps, args.big_batch)
    parts = {}
    for spec in MODELS:
        log(f"one peer: {spec}, the step in parts")
        parts[spec] = measure_parts(spec, args.reps, args.steps)
    log("end to end: ring:8, cnn1d")
    e2e = measure_end_to_end(args.e2e_reps, args.e2e_epochs, args.dataset)
    seconds = time.perf_counter() - started
    page = render(args, one_peer, e2e, seconds, command.strip(), big, parts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, page)
    data = {
        "command": command.strip(),
        "commit": git_commit(),
        "seconds": seconds,
        "one_peer_ms": one_peer,
        f"one_peer_batch_{args.big_batch}_ms": big,
        "one_peer_parts_ms": {spec: part["times"] for spec, part in parts.items()},
        "one_peer_operations": {spec: part["operations"] for spec, part in parts.items()},
        "end_to_end_ms": {
            f"{label} | DP {engine or 'off'}": v for (label, engine), v in e2e["times"].items()
        },
        "end_to_end_steps": e2e["steps"],
    }
    atomic_write(args.out.with_suffix(".json"), json.dumps(data, indent=1))
    log(f"wrote {args.out} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
