"""`python -m experiments bench_gossip`: PowerGossip (rank 1) against exact gossip on the zoo's
ResNet-20 and VGG-16 shapes, 8 peers, in-process and under MPI (`measure.py` the child): bytes,
time per step, the naive and `BEFORE`'s PowerGossip in interleaved blocks, compute efficiency in
situ and for one isolated peer; the kernels; the default VGG-16's bytes (page.md says how)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

import torch

import topologies
from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import compact, header, median, on_machine, python_child
from experiments.pages._bench import quick_mark, run_child
from gossip_powersgd.launch import run_peers

if TYPE_CHECKING:
    from .measure import BenchConfig

#: The commit whose PowerGossip runs beside this tree's: main before Architecture II.
BEFORE = "6df8d52"
#: torus:2x4 has degree 3 (the dimension of size 2 wraps onto the same neighbour), so the page adds
#: an 8-peer graph of degree 4: the circulant C8(1, 2) (Watts-Strogatz with k=4 and no rewiring).
TOPOLOGIES = ("ring:8", "torus:2x4", "small_world:8:4:0")
#: Warm-up PowerGossip steps per variant, and measured exact-gossip steps (after one warm-up step
#: when more than one): VGG-16's exact gossip moves 122 MB per peer and step.
WARMUP_STEPS = {"resnet20": 2, "vgg16": 1, "vgg16_bn": 0}
EXACT_STEPS = {"resnet20": 4, "vgg16": 1, "vgg16_bn": 1}
#: The times a block records per step (compute: total - communication).
TIMES = ("total", "comm", "compute")


def setting(model: str, topology: str, backend: str, steps: int, reps: int) -> Run:
    """A timed setting: `steps` measured PowerGossip steps per variant in `reps` blocks."""
    config = dict(model=model, topology=topology, backend=backend, steps=steps, reps=reps)
    config.update(naive=True, exact_steps=EXACT_STEPS[model], warmup=WARMUP_STEPS[model])
    cost = (20 if model == "vgg16" else 1) * (2 if backend == "mpi" else 1)
    return Run(key=f"{model}/{topology}/{backend}", config=dict(config, before=BEFORE), cost=cost)


def bytes_only(model: str, topology: str) -> Run:
    """Two steps on the in-process peers, bytes only (no timing)."""
    config = dict(model=model, topology=topology, backend="local", steps=2, reps=1, naive=False)
    config.update(exact_steps=EXACT_STEPS[model], warmup=0, bytes_only=True)
    return Run(key=f"{model}/{topology}/local/bytes", config=config)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """The kernels, every model x topology x backend (80 steps in 8 blocks), the BatchNorm VGG's
    bytes; --quick: the same kinds of run on ResNet-20 shapes, ring:4, 2 steps."""
    if quick:
        runs = [setting("resnet20", "ring:4", backend, 2, 1) for backend in ("local", "mpi")]
        return [Run("kernels", {"rounds": 1}), *runs, bytes_only("resnet20", "ring:4")]
    runs = [Run("kernels", {"rounds": 7}, cost=10)]
    for backend in ("local", "mpi"):
        runs += [setting(m, t, backend, 80, 8) for m in ("resnet20", "vgg16") for t in TOPOLOGIES]
    return runs + [bytes_only("vgg16_bn", "ring:8")]


@on_machine
def row(run: Run) -> Dict[str, Any]:
    """The kernels' speeds; or a setting's summary and raw numbers (floats to 5 digits)."""
    from .measure import BenchConfig, isolated_benchmark, kernel_benchmark, peer_benchmark

    torch.set_num_threads(1)
    if run.key == "kernels":
        return kernel_benchmark(run.config["rounds"])
    cfg = BenchConfig(**run.config)
    topology = topologies.parse(cfg.topology)
    if cfg.backend == "mpi":
        with tempfile.TemporaryDirectory(prefix="bench_gossip-") as folder:
            out, module = Path(folder) / "setting.json", "experiments.pages.bench_gossip.measure"
            command = python_child(module, [json.dumps(run.config), str(out)], "mpi", topology.size)
            status, err = run_child(command, 1800)
            if status != 0:
                raise RuntimeError(f"{run.key}: mpiexec failed ({status}): {err.strip()[-500:]}")
            raw = json.loads(out.read_text())
    else:
        started = time.perf_counter()
        values = run_peers(topology, peer_benchmark, cfg, backend="local", timeout=1800)
        iso = None if cfg.bytes_only else isolated_benchmark(cfg, topology)
        raw = {"peers": [values[rank] for rank in sorted(values)], "isolated": iso}
        raw["seconds"] = time.perf_counter() - started
    seconds = raw.pop("seconds")
    summary = dict(summarize_setting(cfg, raw["peers"], raw["isolated"]), seconds=seconds)
    return {"summary": summary, "raw": compact(raw)}


# ---- a setting's summary: means over peers, medians over the interleaved repetitions ----
def _steps(blocks: List[Dict[str, Any]], side: Optional[str] = None) -> List[Dict[str, Any]]:
    """The steps of `blocks` (of one side)."""
    return [st for b in blocks for st in b["steps"] if side in (None, st["side"])]


def _block_means(block: Dict[str, Any], side: Optional[str] = None) -> Dict[str, float]:
    steps = _steps([block], side)
    n = max(1, len(steps))
    total, comm = sum(s["total"] for s in steps) / n, sum(s["comm"] for s in steps) / n
    return {"total": total, "comm": comm, "compute": total - comm}


def _mean(means: List[Dict[str, float]]) -> Dict[str, float]:
    """Block means averaged over the peers."""
    return {k: sum(m[k] for m in means) / len(means) for k in TIMES}


def _ratios(a: List[Dict[str, float]], b: List[Dict[str, float]]) -> Dict[str, float]:
    """Compute and step-time ratios a / b, medians over adjacent (a, b) block pairs."""
    return {k: median([x[k] / y[k] for x, y in zip(a, b)]) for k in ("compute", "total")}


def _sent(blocks_per_peer, side=None) -> float:
    """Bytes per step, mean over steps and peers."""
    per_peer = [_steps(blocks, side) for blocks in blocks_per_peer]
    return sum(sum(st["bytes"] for st in p) / max(1, len(p)) for p in per_peer) / len(per_peer)


def _match(blocks_per_peer) -> bool:
    return all(st["bytes"] == st["expected"] for b in blocks_per_peer for st in _steps(b))


def summarize_setting(
    cfg: BenchConfig, peers: List[Dict[str, Any]], isolated: Optional[Dict[str, Any]]
) -> Dict[str, Any]:
    """Per-setting numbers: means over peers, medians over the interleaved repetitions."""
    first = peers[0]
    s: Dict[str, Any] = dict(model=cfg.model, topology=cfg.topology, backend=cfg.backend)
    s.update(peers=len(peers), degree=first["degree"], params=first["param_bytes"] // 4)
    s.update({k: first[k] for k in ("compressed_fraction", "compressed_bytes", "gamma")})
    s.update(block_steps=cfg.block, reps=cfg.reps, bytes_only=cfg.bytes_only)
    s.update(exact_steps=cfg.exact_steps, exact_warmup=first["exact_warmup"])
    exact_blocks = [[p["exact"]] for p in peers]
    s["exact"] = {"bytes": _sent(exact_blocks), "bytes_match": _match(exact_blocks)}
    if not cfg.bytes_only:
        s["exact"].update(_mean([_block_means(p["exact"]) for p in peers]))
    bw = [median(p["bandwidth_concurrent"]) for p in peers if p["bandwidth_concurrent"]]
    s["bandwidth_concurrent"] = sum(bw) / len(bw) if bw else None
    s["variants"] = {}
    for name in first["variants"]:
        blocks = [p["variants"][name] for p in peers]
        v: Dict[str, Any] = {"bytes": _sent(blocks)}
        v.update(bytes_right=_sent(blocks, "right"), bytes_left=_sent(blocks, "left"))
        v.update(bytes_match=_match(blocks), bytes_ratio=s["exact"]["bytes"] / v["bytes"])
        if not cfg.bytes_only:
            v["reps"] = [_mean([_block_means(b[r]) for b in blocks]) for r in range(len(blocks[0]))]
            v.update({k: median([r[k] for r in v["reps"]]) for k in TIMES})
            # K = 1 half-step per step, so compute per step is compute per half-step.
            if s["bandwidth_concurrent"]:
                v["efficiency_in_situ"] = (
                    3 * s["compressed_bytes"] / (v["compute"] * s["bandwidth_concurrent"] * 1e9)
                )
        s["variants"][name] = v
    if "naive" in s["variants"]:
        s["speedup"] = _ratios(s["variants"]["naive"]["reps"], s["variants"]["batched"]["reps"])
    if "before" in s["variants"]:
        s["before"] = summarize_before(cfg, peers, s["variants"])
    if isolated is not None:
        s["isolated"] = summarize_isolated(isolated)
    return s


def summarize_before(
    cfg: BenchConfig, peers: List[Dict[str, Any]], variants: Dict[str, Any]
) -> Dict[str, Any]:
    """`cfg.before`'s PowerGossip against this tree's: time ratios new / old (medians over
    adjacent block pairs), whether every peer sent the same bytes at every step and ended with
    bit-identical parameters."""

    def sent(p, name):
        return [st["bytes"] for st in _steps(p["variants"][name])]

    return {
        "commit": cfg.before,
        "modules": peers[0]["before"]["modules"],
        "ratio": _ratios(variants["batched"]["reps"], variants["before"]["reps"]),
        "bytes_equal": all(sent(p, "batched") == sent(p, "before") for p in peers),
        "identical": all(p["before"]["identical"] for p in peers),
        "max_difference": max(p["before"]["max_difference"] for p in peers),
    }


def summarize_isolated(iso: Dict[str, Any]) -> Dict[str, Any]:
    """The isolated peer's compute times and efficiencies per side, medians over the rounds."""
    out: Dict[str, Any] = {k: iso[k] for k in ("degree", "threads")}
    out.update(bandwidth=median(iso["bandwidth"]), variants={})
    for name, blocks in iso["variants"].items():
        out["variants"][name] = v = {}
        for side in (None, "right", "left"):
            times = [_block_means(b, side)["compute"] for b in blocks]
            effs = [
                3 * iso["compressed_bytes"] / (t * bw * 1e9)
                for t, bw in zip(times, iso["bandwidth"])
            ]
            v[side or "all"] = {"compute": median(times), "efficiency": median(effs)}

    def paired(a, b):  # compute a / compute b, median over the rounds (adjacent blocks)
        return _ratios([_block_means(x) for x in a], [_block_means(y) for y in b])["compute"]

    blocks = iso["variants"]
    if {"before", "batched"} <= set(blocks):  # this tree's / the earlier commit's
        out["before_ratio"] = paired(blocks["batched"], blocks["before"])
    if "naive" in blocks:
        out["speedup"] = paired(blocks["naive"], blocks["batched"])
    return out


def render(rows: Rows) -> Outputs:
    """The page (report.py)."""
    from .report import render_markdown

    kernels = rows.by_key.get("kernels")
    summaries = [r.row["summary"] for r in rows.records if r.key != "kernels"]
    page = render_markdown(summaries, kernels, header(rows), quick_mark(rows))
    return {"bench_gossip.md": page + "\n"}


TITLE = "PowerGossip r1 vs exact gossip on ResNet-20 / VGG-16 shapes: bytes, time, efficiency"
PAGE = register(Page("bench_gossip", TITLE, plan, row, render, serial=True))
