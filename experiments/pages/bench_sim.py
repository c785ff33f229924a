"""`python -m experiments bench_sim`: PowerGossip rank 1 on many in-process peers (ResNet-20
shapes, ring, one torch thread), side by side in one run: steps/s of the `SETUPS`, bit-identity,
the divergence from commit `before`, one peer alone, `big_peers` peers in two lanes. Earlier
commits' PowerGossip is read with git (`_commit_code`); one that cannot be read is left out."""

from __future__ import annotations

import contextlib
import resource
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping
from unittest import mock

import torch

import topologies
from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import LoopbackCommunicator, compare_params, count_params, header
from experiments.pages._bench import make_params, median, model_shapes, on_machine, quick_mark
from experiments.pages._bench import resident_bytes
from experiments.pages._commit_code import loaded_modules, previous_powergossip
from experiments.pages._markdown import fill, snippets, table, table_rows, template
from experiments.pages.bench_gossip import summarize_isolated
from experiments.pages.bench_gossip.measure import BenchConfig, isolated_benchmark
from gossip_powersgd import LocalCluster, PowerGossip
from gossip_powersgd.algorithms import kernels, powergossip
from gossip_powersgd.metrics import consensus_distance

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

#: The page's parts shown where the run calls for them, and the steps table's column titles.
PARTS = snippets(__file__, "bench_sim_parts.md")

#: The page's run and --quick's.
SETTING = {
    False: dict(peers=64, steps=100, reps=9, big_peers=256, big_steps=6, before_steps=20),
    True: dict(peers=4, steps=2, reps=1, big_peers=4, big_steps=1, before_steps=2),
}
#: name -> (PowerGossip: "before", "previous" or "tree", cooperative, lanes, tensor work as Python).
SETUPS = {
    "before": ("before", False, 1, False),
    "free": ("tree", False, 1, False),
    "previous": ("previous", True, 1, False),
    "turns": ("tree", True, 1, False),
    "lanes python": ("tree", True, 2, True),
    "lanes": ("tree", True, 2, False),
}


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    config = dict(SETTING[quick], before="c0bf4d7", previous="6df8d52", helpers="own")
    config.update(divergence_peers=4 if quick else 16, isolated_steps=2 if quick else 100)
    return [Run(key=f"ring:{config['peers']}/{config['reps']}reps", config=config)]


def python_kernels():
    """PowerGossip's tensor work as the kernels' Python bodies, not compiled, within the block."""
    names = ("multiply_into_messages", "form_factors_and_update")
    return mock.patch.multiple(
        powergossip, **{name: getattr(kernels, name).python for name in names}
    )


def cluster_run(
    algorithm: type, peers: int, steps: int, cooperative: bool, lanes: int = 1, python=False
) -> Dict[str, Any]:
    """`steps` gossip steps (after two warm-up steps) on `peers` threads in `lanes` lanes (`python`:
    tensor work as Python): steps/s of the slowest peer between barriers; the final parameters."""
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

    cluster = LocalCluster(topologies.parse(f"ring:{peers}"), cooperative=cooperative, lanes=lanes)
    before = resource.getrusage(resource.RUSAGE_SELF)
    with python_kernels() if python else contextlib.nullcontext():
        out = cluster.run(peer)
    after = resource.getrusage(resource.RUSAGE_SELF)
    # The whole run's context switches (all threads, set-up included) per measured step.
    switches = (after.ru_nvcsw + after.ru_nivcsw - before.ru_nvcsw - before.ru_nivcsw) / steps
    wall = max(seconds for seconds, _ in out)
    params = [x for _, x in out]
    return dict(
        steps_per_s=steps / wall, seconds_per_step=wall / steps, switches=switches, params=params
    )


def divergence(before: type, peers: int, marks=(1, 10, 100)) -> Dict[int, Dict[str, float]]:
    """`before`'s PowerGossip against this tree's on ring:`peers` (ResNet-20 shapes, rank 1): the
    largest parameter difference and both consensus distances after each of `marks` steps."""

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
                compare_params(pn[step][0], po[step][0])["max_difference"]
                for pn, po in zip(new, old)
            ),
            "consensus_new": new[0][step][1],
            "consensus_before": old[0][step][1],
        }
        for step in marks
    }


def one_thread_run(peers: int, steps: int) -> float:
    """Steps/s of `peers` PowerGossip peers stepped in turn by this thread, each on a loopback
    transport: the simulation's per-peer compute without threads or messages."""
    topology = topologies.parse(f"ring:{peers}")
    shapes = model_shapes("resnet20")
    gossips = [
        PowerGossip(make_params(shapes, rank), LoopbackCommunicator(topology, rank, None), rank=1)
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


def isolated(versions: Dict[str, type], model: str, steps: int, reps: int) -> Dict[str, Any]:
    """Peer 0 of ring:8 alone (`bench_gossip`'s isolated peer): per version, compute ms per
    half-step and its fraction of the copy bandwidth, medians over `reps` interleaved blocks."""
    cfg = BenchConfig(model, "ring:8", "local", steps * reps, reps, naive=False, warmup=2)
    algorithms = {name: (algorithm, True) for name, algorithm in versions.items()}
    iso = summarize_isolated(isolated_benchmark(cfg, topologies.parse(cfg.topology), algorithms))
    return {
        name: {"ms": v["all"]["compute"] * 1e3, "of_copy": v["all"]["efficiency"]}
        for name, v in iso["variants"].items()
    }


@on_machine
def row(run: Run) -> Dict[str, Any]:
    """The interleaved repetitions, the divergence from `before`, the isolated peer, the big run."""
    c = run.config
    torch.set_num_threads(1)
    own = c["helpers"] == "own"
    versions = {n: previous_powergossip(c[n], helpers=own) for n in ("before", "previous") if c[n]}
    earlier = [n for n, version in versions.items() if version is not None]
    versions = {"tree": PowerGossip, **{n: versions[n] for n in earlier}}
    setups = {name: setup for name, setup in SETUPS.items() if setup[0] in versions}
    results: Dict[str, Any] = {
        "sim": {name: [] for name in [*setups, "one thread"]},
        "switches": {name: [] for name in setups},
        "modules": {c[n]: loaded_modules(c[n], own) for n in earlier},
    }
    finals = {}
    for rep in range(c["reps"]):
        for name in list(setups) if rep % 2 == 0 else list(setups)[::-1]:
            version, cooperative, lanes, python = setups[name]
            steps = c["before_steps"] if name == "before" else c["steps"]
            out = cluster_run(versions[version], c["peers"], steps, cooperative, lanes, python)
            results["sim"][name].append(out["steps_per_s"])
            results["switches"][name].append(out["switches"])
            finals[name] = out["params"]
        results["sim"]["one thread"].append(one_thread_run(c["peers"], c["steps"]))
    reference = [t for params in finals["free"] for t in params]
    results["identical"] = all(
        compare_params(reference, [t for params in finals[name] for t in params])["identical"]
        for name in setups
        if name not in ("before", "free")
    )
    results["scale"] = max(float(t.abs().max()) for t in reference)
    del finals
    if "before" in versions:
        results["divergence"] = divergence(versions["before"], c["divergence_peers"])
    named = {"before": "before", "previous": "previous", "tree": "after"}
    by_model = {
        model: isolated({named[n]: v for n, v in versions.items()}, model, steps, 5)
        for model, steps in (("resnet20", c["isolated_steps"]), ("vgg16", 4))
    }
    results["isolated"] = {v: {m: by_model[m][v] for m in by_model} for v in by_model["vgg16"]}
    rss_before = resident_bytes() / 2**20
    out = cluster_run(PowerGossip, c["big_peers"], c["big_steps"], cooperative=True, lanes=2)
    results["big"] = {
        "steps": c["big_steps"],
        "seconds_per_step": out["seconds_per_step"],
        "rss_before": rss_before,
        "rss_after": resident_bytes() / 2**20,
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    return results


def earlier_code(c: Dict[str, Any], modules: Dict[str, List[str]]) -> str:
    """A sentence on the page: which modules of the earlier commits ran."""
    files = "; ".join(
        f"`{commit}`: " + ", ".join(f"`{m}.py`" for m in names) for commit, names in modules.items()
    )
    return PARTS["own" if c["helpers"] == "own" else "tree"].format(files=files) if modules else ""


def render(rows: Rows) -> Outputs:
    """The results page."""
    (record,) = rows.records
    c, results = record.config, record.row
    shapes = model_shapes("resnet20")
    half = (c["peers"] + 1) // 2  # lane of rank r: r * 2 // peers (LocalCluster)
    sim, switches = results["sim"], results["switches"]
    variants = list(sim)  # the steps table's columns: SETUPS' order (parts.md's `column NAME`)
    each = [
        ("steps / s (median of reps)", lambda v: f"**{median(sim[v]):.1f}**"),
        ("each rep", lambda v: ", ".join(f"{s:.1f}" for s in sim[v])),
        (
            "context switches of the process per step (median)",
            lambda v: f"{median(switches[v]):,.0f}" if v in switches else "–",
        ),
    ]
    # a header whose first cell is empty ("| |"), then the rule and the lines as `table` makes them
    steps_table = ["| | " + " | ".join(PARTS[f"column {v}"].format(**c) for v in variants) + " |"]
    steps_table += table(variants + [""], ([w, *map(cell, variants)] for w, cell in each))[1:]
    page = fill(
        template(__file__, "bench_sim.md"),
        quick=quick_mark(rows),
        header=header(rows),
        parameters=count_params(shapes),
        compressed_mb=4 * count_params([s for s in shapes if len(s[1]) >= 2]) / 1e6,
        last_first=half - 1,
        half=half,
        last=c["peers"] - 1,
        earlier_code=earlier_code(c, results["modules"]),
        steps_table=steps_table,
        sections=_sections(c, results, variants),
        **_isolated(c, results),
        **{f"big_{k}": v for k, v in results["big"].items() if k != "steps"},
        **c,
    )
    return {"bench_sim.md": page + "\n"}


def _sections(c: Dict[str, Any], results: Dict[str, Any], variants: List[str]) -> List[str]:
    """The ratios, the bit-identity, the divergence from `before`."""
    sim = {v: median(results["sim"][v]) for v in variants}
    ratios = [
        f"two lanes / one lane: **{sim['lanes'] / sim['turns']:.2f}×**",
        f"two lanes, compiled / as Python: {sim['lanes'] / sim['lanes python']:.2f}×",
    ]
    if "previous" in sim:
        pairs = [t / p for t, p in zip(results["sim"]["turns"], results["sim"]["previous"])]
        ratios.append(
            PARTS["previous ratios"].format(
                previous=c["previous"],
                lanes=sim["lanes"] / sim["previous"],
                turns=sim["turns"] / sim["previous"],
                pairs=", ".join(f"{r:.2f}" for r in pairs),
                median=median(pairs),
            )
        )
    ratios.append(f"one lane / free threads (this tree): {sim['turns'] / sim['free']:.1f}×")
    if "before" in sim:
        ratios.append(f"two lanes / before: {sim['lanes'] / sim['before']:.1f}×")
    with_previous = f" and with `{c['previous']}`" if "previous" in sim else ""
    identical = "yes" if results["identical"] else "no"
    lines = ["Ratios of the medians: " + "; ".join(ratios) + ".", ""]
    lines += [PARTS["identical"].format(with_previous=with_previous, identical=identical), ""]
    if "divergence" in results:
        lines += PARTS["divergence"].format(scale=results["scale"], **c).split("\n")
        lines += table_rows(
            [str(step), f"{d['difference']:.1e}", f"{d['consensus_new']:.6g}"]
            + [f"{d['consensus_before']:.6g}"]
            for step, d in results["divergence"].items()
        ) + [""]
    return lines


def _isolated(c: Dict[str, Any], results: Dict[str, Any]) -> Dict[str, Any]:
    """One peer's half-step alone, per version: the table, the ratio to `previous`, the rate."""
    iso = results["isolated"]
    shown = [v for v in ("before", "previous", "after") if v in iso]
    name = {"before": f"before (`{c['before']}`)", "previous": f"`{c['previous']}`"}
    head = ["model", *(f"{name.get(v, 'after (this tree)')}: ms, % of copy" for v in shown)]
    models = ("resnet20", "vgg16")
    cells = [
        [m, *(f"{iso[v][m]['ms']:.2f} ms, **{iso[v][m]['of_copy'] * 100:.0f} %**" for v in shown)]
        for m in models
    ]
    lines = table(head, cells, None)
    if "previous" in iso:
        ratios = ", ".join(
            f"{m} {iso['previous'][m]['ms'] / iso['after'][m]['ms']:.2f}×" for m in models
        )
        lines += ["", PARTS["exchange"].format(previous=c["previous"], ratios=ratios)]
    return dict(isolated=lines, big_rate=1 / results["big"]["seconds_per_step"])


TITLE = "PowerGossip r1 on 64 in-process peers: free threads, turns, two lanes, earlier commits"
PAGE = register(Page("bench_sim", TITLE, plan, row, render, serial=True))
