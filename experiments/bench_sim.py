"""Simulation at scale: PowerGossip on many in-process peers, and one half-step's efficiency.

    python -m experiments.bench_sim [--peers 64] [--steps 100] [--reps 3] [--big-peers 256] [--before c0bf4d7]
                                    [--before-steps 20] [--previous 6df8d52] [--helpers own|tree]
                                    [--out experiments/results/bench_sim.md]

Measures, with ResNet-20-shaped random parameters and PowerGossip rank 1 on a ring, one torch
thread: (1) gossip steps per second of a `LocalCluster` of `--peers` peers (one thread each), in
interleaved repetitions of the same run, for six set-ups: the `PowerGossip` of commit `--before`
on free-running threads (the cluster as it was then), the current one on free-running threads
(`cooperative=False`), the `PowerGossip` of commit `--previous` taking turns, one peer at a time
(the cluster as it was then), the current one the same way (`cooperative=True`, the default when
peers outnumber cores), and the current one in two lanes (`lanes=2`: two peers at once), with its
tensor work as Python and compiled (the default); whether all but `--before` end with
bit-identical parameters; and, as the bound for one peer at a time, every peer stepped in turn by
one thread on a loopback transport; (2) how far
`--before`'s results are from the current ones, step by step, with both consensus distances;
(3) one peer's half-step alone on a loopback transport (ResNet-20 and VGG-16), as a fraction of
the copy bandwidth measured right before each block (3 x compressed bytes / (compute time per
half-step x copy GB/s), as in `experiments.bench_gossip`); (4) `--big-peers` peers taking turns:
seconds per step and the process's memory. Earlier implementations are read with `git show` and
imported under other module names (`experiments.commit_code`), so all run side by side in one
process, with their own helper modules from `algorithms/` (`--helpers own`, the default: the
commit's code as it was) or with this tree's (`--helpers tree`, how the pages up to commit 886c08c
ran them); without git, or where a commit cannot be read, their columns are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

import topologies
from experiments.bench_gossip.measure import copy_bandwidth, loopback_communicator, median
from experiments.bench_gossip.record import machine_description
from experiments.bench_gossip.shapes import count_params, make_params, model_shapes
from experiments.commit_code import loaded_modules, previous_powergossip
from gossip_powersgd import LocalCluster, PowerGossip
from gossip_powersgd.utils import atomic_write, git_commit

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

ROOT = Path(__file__).resolve().parents[1]


def resident_mib() -> float:
    """This process's resident memory now (MiB, from /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextlib.contextmanager
def python_kernels():
    """PowerGossip's tensor work run as the kernels' Python bodies, not compiled (what compiling
    buys), until the block ends."""
    from gossip_powersgd.algorithms import kernels, powergossip

    names = ("multiply_into_messages", "form_factors_and_update")
    saved = {name: getattr(powergossip, name) for name in names}
    try:
        for name in names:
            setattr(powergossip, name, getattr(kernels, name).python)
        yield
    finally:
        for name, value in saved.items():
            setattr(powergossip, name, value)


def cluster_run(
    algorithm: type,
    peers: int,
    steps: int,
    cooperative: Optional[bool] = None,
    pin: Optional[bool] = None,
    lanes: int = 1,
    python: bool = False,
) -> Dict[str, Any]:
    """`steps` gossip steps (after two warm-up steps) on `peers` threads in `lanes` lanes (with the
    tensor work as Python for `python`); steps/s from the slowest peer's wall time between two
    barriers, and the final parameters."""
    shapes = model_shapes("resnet20")

    def peer(comm: Comm):
        x = make_params(shapes, comm.rank)
        gossip = algorithm(x, comm, rank=1)
        gossip.step()
        gossip.step()
        comm.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            gossip.step()
        comm.barrier()
        return time.perf_counter() - start, x

    cluster = LocalCluster(
        topologies.parse(f"ring:{peers}"), cooperative=cooperative, pin=pin, lanes=lanes
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    with python_kernels() if python else contextlib.nullcontext():
        out = cluster.run(peer)
    after = resource.getrusage(resource.RUSAGE_SELF)
    # The whole run's context switches (all threads, set-up included) per measured step.
    switches = (after.ru_nvcsw + after.ru_nivcsw - before.ru_nvcsw - before.ru_nivcsw) / steps
    wall = max(seconds for seconds, _ in out)
    return {
        "steps_per_s": steps / wall,
        "seconds_per_step": wall / steps,
        "switches": switches,
        "params": [x for _, x in out],
    }


def divergence(before: type, peers: int, marks=(1, 10, 100)) -> Dict[int, Dict[str, float]]:
    """`before`'s PowerGossip against this tree's on ring:`peers` (ResNet-20 shapes, rank 1): the
    largest parameter difference and both consensus distances after each of `marks` steps."""
    from gossip_powersgd.metrics import consensus_distance

    def peer(comm: Comm, algorithm):
        x = make_params(model_shapes("resnet20"), comm.rank)
        gossip = algorithm(x, comm, rank=1)
        out = {}
        for step in range(1, max(marks) + 1):
            gossip.step()
            if step in marks:
                out[step] = ([t.clone() for t in x], consensus_distance(x, comm))
        return out

    topology = topologies.parse(f"ring:{peers}")
    new, old = (LocalCluster(topology).run(peer, algorithm) for algorithm in (PowerGossip, before))
    return {
        step: {
            "difference": max(
                float((a - b).abs().max())
                for pn, po in zip(new, old)
                for a, b in zip(pn[step][0], po[step][0])
            ),
            "consensus_new": new[0][step][1],
            "consensus_before": old[0][step][1],
        }
        for step in marks
    }


def one_thread_run(peers: int, steps: int) -> float:
    """Steps/s of `peers` PowerGossip peers stepped in turn by this thread, each on a loopback
    transport: the same per-peer compute on the same working set, without threads or messages
    (what the simulation would reach if switching peers and moving messages cost nothing)."""
    topology = topologies.parse(f"ring:{peers}")
    shapes = model_shapes("resnet20")
    gossips = [
        PowerGossip(make_params(shapes, rank), loopback_communicator(topology, rank), rank=1)
        for rank in range(peers)
    ]
    for _ in range(2):
        for gossip in gossips:
            gossip.step()
    start = time.perf_counter()
    for _ in range(steps):
        for gossip in gossips:
            gossip.step()
    return steps / (time.perf_counter() - start)


def isolated(algorithm: type, model: str, steps: int, reps: int) -> Dict[str, float]:
    """Peer 0 of a ring alone on a loopback transport: compute ms per half-step and its fraction of
    a one-thread 256 MB copy, paired per block, medians."""
    comm = loopback_communicator(topologies.parse("ring:8"), 0)
    gossip = algorithm(make_params(model_shapes(model), 0), comm, rank=1)
    compressed = sum(
        t.numel() * t.element_size()
        for k, t in enumerate(gossip.params)
        if k in gossip.compressed_indices
    )
    for _ in range(2):
        gossip.step()
    src = torch.ones(64 * 2**20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times, fractions = [], []
    for _ in range(reps):
        bandwidth = copy_bandwidth(0, 1, (src, dst))[0]
        total, communication = gossip.time_total, gossip.time_communication
        for _ in range(steps):
            gossip.step()
        seconds = (
            (gossip.time_total - total) - (gossip.time_communication - communication)
        ) / steps
        times.append(seconds * 1e3)
        fractions.append(3 * compressed / (seconds * bandwidth * 1e9))
    return {"ms": median(times), "of_copy": median(fractions)}


def command(args) -> str:
    """The command line that makes this page (every option that shapes it)."""
    words = [
        "python -m experiments.bench_sim",
        f"--peers {args.peers} --steps {args.steps} --reps {args.reps}",
        f"--big-peers {args.big_peers} --big-steps {args.big_steps}",
        f"--before '{args.before}'" if not args.before else f"--before {args.before}",
        f"--before-steps {args.before_steps}",
        f"--previous '{args.previous}'" if not args.previous else f"--previous {args.previous}",
        f"--helpers {args.helpers}",
        f"--divergence-peers {args.divergence_peers}",
    ]
    if args.out_given:
        words.append(f"--out {args.out}")
    return " ".join(words)


def earlier_code(args, results: Dict[str, Any]) -> str:
    """A sentence on the page: which modules of the earlier commits ran."""
    if not results["modules"]:
        return ""
    files = "; ".join(
        f"`{commit}`: " + ", ".join(f"`{m}.py`" for m in modules)
        for commit, modules in results["modules"].items()
    )
    if args.helpers == "own":
        return (
            "Earlier commits' PowerGossip runs with that commit's own helper modules, read "
            "from it "
            f"with git and imported beside this tree's (`experiments/commit_code.py`; {files})."
        )
    return (
        f"Earlier commits' PowerGossip modules ({files}; read with git) run with this tree's "
        "helper modules (`--helpers tree`)."
    )


def render(args, results: Dict[str, Any], seconds: float) -> str:
    """The results page."""
    load = os.getloadavg()
    shapes = model_shapes("resnet20")
    compressed = sum(4 * count_params([item]) for item in shapes if len(item[1]) >= 2)
    half = (args.peers + 1) // 2  # lane of rank r: r * 2 // peers (LocalCluster)
    variants = [
        v
        for v in ("before", "free", "previous", "turns", "lanes python", "lanes", "one thread")
        if v in results["sim"]
    ]
    label = {
        "before": f"`{args.before}`'s PowerGossip, free threads ({args.before_steps} steps)",
        "free": "this tree, free threads",
        "previous": f"`{args.previous}`'s PowerGossip, taking turns, one lane (the cluster as "
        f"at `{args.previous}`)",
        "turns": "this tree, taking turns, one lane (the default)",
        "lanes python": "this tree, two lanes, tensor work as Python (not compiled)",
        "lanes": "**this tree, two lanes** (`lanes=2`)",
        "one thread": "bound for one lane: one thread, no messages",
    }
    L = [
        "# Simulation at scale: PowerGossip rank 1 on in-process peers",
        "",
        f"Command: `{command(args)}`",
        "",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC ({seconds:.0f} s), "
        f"commit {git_commit()}. "
        f"Machine: {machine_description()['cpu']}, {os.cpu_count()} cores shared with other jobs (load average {load[0]:.1f} at the "
        f"end), Python {platform.python_version()}, torch {torch.__version__}, one torch thread. "
        "Absolute times move by 2x between runs on this shared machine; the columns come from "
        "interleaved repetitions of one run.",
        "",
        f"ResNet-20-shaped random float32 parameters ({count_params(shapes):,}, "
        f"{compressed / 1e6:.2f} MB in compressed matrices), "
        "PowerGossip rank 1, one half-step per step, warm start, ring topology (degree 2), "
        "`LocalCluster` (one thread per peer). *Free threads*: `cooperative=False`, every peer "
        "thread runs whenever the GIL lets it. *Taking turns*: `cooperative=True` (the default "
        "when peers outnumber cores), one peer runs until it waits for a message or a "
        "collective; its peer threads are pinned to one core (as many as torch's intra-op "
        "threads, here 1; `LocalCluster(pin=None)`, the default). *Two lanes*: `lanes=2`, ranks "
        f"0-{half - 1} and {half}-{args.peers - 1} take turns on their own, each lane pinned to its own core, so two peers "
        "run at once; PowerGossip's tensor work is compiled by TorchScript, which runs it without "
        "the GIL (*as Python*: the same functions, not compiled). "
        + earlier_code(args, results)
        + " Each repetition "
        f"times {args.steps} steps after two warm-up steps. *One thread*: every peer stepped in "
        "turn by one thread on a loopback "
        "transport (no threads, no messages): the bound for this per-peer compute one peer at a "
        "time. Context "
        "switches: voluntary and involuntary, of all the process's threads over the whole "
        "cluster run (set-up included), divided by the measured steps; free threads switch at "
        "nearly every tensor operation, because PyTorch releases the GIL around each one.",
        "",
        "The ResNet-20 shapes are the zoo's model (`gossip_powersgd.training.zoo.ResNet20`, built "
        f"on the meta device; {count_params(shapes):,} parameters, with the paper's 1x1-convolution shortcuts); pages "
        "made up to commit 886c08c used the benchmark's own list, with parameter-free shortcuts "
        "(269,722 parameters).",
        "",
        f"## {args.peers} peers: gossip steps per second",
        "",
        "| | " + " | ".join(label[v] for v in variants) + " |",
        "|---|" + "---|" * len(variants),
        "| steps / s (median of reps) | "
        + " | ".join(f"**{median(results['sim'][v]):.1f}**" for v in variants)
        + " |",
        "| each rep | "
        + " | ".join(", ".join(f"{s:.1f}" for s in results["sim"][v]) for v in variants)
        + " |",
        "| context switches of the process per step (median) | "
        + " | ".join(
            f"{median(results['switches'][v]):,.0f}" if v in results["switches"] else "–"
            for v in variants
        )
        + " |",
        "",
    ]
    sim = {v: median(results["sim"][v]) for v in variants}
    ratios = [
        f"two lanes / one lane: **{sim['lanes'] / sim['turns']:.2f}×**",
        f"two lanes, compiled / as Python: {sim['lanes'] / sim['lanes python']:.2f}×",
    ]
    if "previous" in sim:
        pairs = [t / p for t, p in zip(results["sim"]["turns"], results["sim"]["previous"])]
        paired = ", ".join(f"{r:.2f}" for r in pairs)
        ratios += [
            f"two lanes / `{args.previous}`: **{sim['lanes'] / sim['previous']:.2f}×**",
            f"one lane, this tree / `{args.previous}`: {sim['turns'] / sim['previous']:.2f}× "
            f"(repetition by repetition, the two run next to each other: {paired}; median "
            f"{median(pairs):.2f}×)",
        ]
    ratios.append(f"one lane / free threads (this tree): {sim['turns'] / sim['free']:.1f}×")
    if "before" in sim:
        ratios.append(f"two lanes / before: {sim['lanes'] / sim['before']:.1f}×")
    L += ["Ratios of the medians: " + "; ".join(ratios) + ".", ""]
    if "identical" in results:
        L += [
            "Final parameters of all peers bit-identical with free threads, one lane and two "
            f"lanes, compiled or not{f' and with `{args.previous}`' if 'previous' in sim else ''}: "
            f"**{'yes' if results['identical'] else 'no'}**."
        ]
        L += [""]
    if "divergence" in results:
        L += [
            f"## The same algorithm as `{args.before}`, rounded differently",
            "",
            f"At rank 1 the factors sit in the messages' row layout, and BLAS rounds a product "
            "with such a strided operand differently, so the bits differ from "
            f"`{args.before}`'s. The two ends of an edge still "
            "form identical factors, since they subtract the same two products. The differences "
            "start at float rounding and the power iteration amplifies them (its factor "
            "directions depend on them), while the consensus distances stay close. "
            f"ring:{args.divergence_peers}, ResNet-20 shapes, rank 1, random parameters "
            f"(up to {results['scale']:.1f} in absolute value):",
            "",
            f"| steps | largest parameter difference | consensus distance, this tree | "
            f"consensus distance, `{args.before}` |",
            "|---|---|---|---|",
        ]
        for step, row in results["divergence"].items():
            L.append(
                f"| {step} | {row['difference']:.1e} | {row['consensus_new']:.6g} | "
                f"{row['consensus_before']:.6g} |"
            )
        L += [""]
    isolated_variants = [v for v in ("before", "previous", "after") if v in results["isolated"]]
    ilabel = {
        "before": f"before (`{args.before}`)",
        "previous": f"`{args.previous}`",
        "after": "after (this tree)",
    }
    L += [
        "## One peer's half-step alone (loopback transport, degree 2)",
        "",
        "| model | " + " | ".join(f"{ilabel[v]}: ms, % of copy" for v in isolated_variants) + " |",
        "|---|" + "---|" * len(isolated_variants),
    ]
    for model in ("resnet20", "vgg16"):
        L.append(
            f"| {model} | "
            + " | ".join(
                f"{results['isolated'][v][model]['ms']:.2f} ms, **{results['isolated'][v][model]['of_copy'] * 100:.0f} %**"
                for v in isolated_variants
            )
            + " |"
        )
    if "previous" in results["isolated"]:
        iso = results["isolated"]
        L += [
            "",
            f"Half-step time, `{args.previous}` / this tree (above 1: this tree is faster): "
            + ", ".join(
                f"{model} {iso['previous'][model]['ms'] / iso['after'][model]['ms']:.2f}×"
                for model in ("resnet20", "vgg16")
            )
            + ".",
        ]
    big = results["big"]
    L += [
        "",
        f"## {args.big_peers} peers (this tree, two lanes)",
        "",
        f"{big['steps']} steps: **{big['seconds_per_step']:.2f} s per step** "
        f"({1 / big['seconds_per_step']:.1f} steps/s); resident memory of the process "
        f"{big['rss_before']:.0f} MiB before the cluster, {big['rss_after']:.0f} MiB with its "
        f"results held, peak {big['peak']:.0f} MiB.",
        "",
    ]
    return "\n".join(L)


def main(argv: Optional[List[str]] = None) -> None:
    """Run the measurements and write the page."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100, help="measured steps per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--big-peers", type=int, default=256)
    parser.add_argument("--big-steps", type=int, default=6)
    parser.add_argument(
        "--before",
        default="c0bf4d7",
        help="commit whose PowerGossip is 'before', on free threads ('' to leave out)",
    )
    parser.add_argument(
        "--before-steps",
        type=int,
        default=20,
        help="measured steps per repetition of 'before' (about 1 step/s)",
    )
    parser.add_argument(
        "--previous",
        default="6df8d52",
        help="commit whose PowerGossip runs taking turns, one lane, beside this tree's, its final "
        "parameters compared bit for bit (default 6df8d52: main before Architecture II; '' to "
        "leave out)",
    )
    parser.add_argument(
        "--helpers",
        choices=("own", "tree"),
        default="own",
        help="the helper modules (base, exact, lowrank, kernels, ...) that --before and --previous "
        "run with: 'own' each commit's own, as it was (default); 'tree' this tree's, as pages up to "
        "886c08c did",
    )
    parser.add_argument("--divergence-peers", type=int, default=16)
    parser.add_argument(
        "--out",
        default=None,
        help="the page (default runs/bench_sim.md; the committed page: "
        "--out experiments/results/bench_sim.md)",
    )
    args = parser.parse_args(argv)
    args.out_given = args.out is not None
    if args.out is None:
        args.out = str(ROOT / "runs" / "bench_sim.md")
    torch.set_num_threads(1)
    start = time.perf_counter()
    helpers = args.helpers == "own"
    earlier: Dict[str, Optional[type]] = {}
    for option, commit in (("--before", args.before), ("--previous", args.previous)):
        if commit:
            earlier[commit] = previous_powergossip(commit, helpers=helpers)
            if earlier[commit] is None:
                print(
                    f"{option} {commit}: not readable with git, its column is left out", flush=True
                )
    before = earlier.get(args.before)
    previous = earlier.get(args.previous)
    # name -> (PowerGossip class, cooperative, lanes, tensor work as Python, steps)
    setups = {"free": (PowerGossip, False, 1, False, args.steps)}
    if previous is not None:
        setups["previous"] = (previous, True, 1, False, args.steps)
    setups.update(
        {
            "turns": (PowerGossip, True, 1, False, args.steps),
            "lanes python": (PowerGossip, True, 2, True, args.steps),
            "lanes": (PowerGossip, True, 2, False, args.steps),
        }
    )
    if before is not None:
        setups = {"before": (before, False, 1, False, args.before_steps), **setups}
    results: Dict[str, Any] = {
        "sim": {v: [] for v in [*setups, "one thread"]},
        "isolated": {},
        "switches": {},
        "modules": {
            commit: loaded_modules(commit, helpers)
            for commit, algorithm in earlier.items()
            if algorithm is not None
        },
    }
    finals = {}
    for rep in range(args.reps):
        for name in list(setups) if rep % 2 == 0 else list(setups)[::-1]:
            algorithm, cooperative, lanes, python, steps = setups[name]
            run = cluster_run(algorithm, args.peers, steps, cooperative, lanes=lanes, python=python)
            results["sim"][name].append(run["steps_per_s"])
            results["switches"].setdefault(name, []).append(run["switches"])
            finals[name] = run["params"]
            print(f"{args.peers} peers, {name}: {run['steps_per_s']:.1f} steps/s", flush=True)
        results["sim"]["one thread"].append(one_thread_run(args.peers, args.steps))
        print(
            f"{args.peers} peers, one thread: {results['sim']['one thread'][-1]:.1f} steps/s",
            flush=True,
        )
    reference = finals["free"]
    results["identical"] = all(
        torch.equal(a.view(-1).view(torch.int32), b.view(-1).view(torch.int32))
        for name in setups
        if name not in ("before", "free")
        for pa, pb in zip(reference, finals[name])
        for a, b in zip(pa, pb)
    )
    results["scale"] = max(float(a.abs().max()) for pa in reference for a in pa)
    del finals
    if before is not None:
        results["divergence"] = divergence(before, args.divergence_peers)
    variants = {"before": before, "previous": previous, "after": PowerGossip}
    variants = {name: algorithm for name, algorithm in variants.items() if algorithm is not None}
    results["isolated"] = {v: {} for v in variants}
    # Model by model, the variants one after the other (one model's figures are minutes apart).
    for model, steps in (("resnet20", 100), ("vgg16", 4)):
        for name, algorithm in variants.items():
            results["isolated"][name][model] = isolated(algorithm, model, steps, 5)
            print(f"isolated {model}, {name}: {results['isolated'][name][model]}", flush=True)
    rss_before = resident_mib()
    run = cluster_run(PowerGossip, args.big_peers, args.big_steps, cooperative=True, lanes=2)
    results["big"] = {
        "steps": args.big_steps,
        "seconds_per_step": run["seconds_per_step"],
        "rss_before": rss_before,
        "rss_after": resident_mib(),
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(f"{args.big_peers} peers: {run['seconds_per_step']:.2f} s/step", flush=True)
    page = render(args, results, time.perf_counter() - start)
    atomic_write(args.out, page + "\n")
    print(page)


if __name__ == "__main__":
    main()
