"""`python -m experiments bench_gossip`: PowerGossip (rank 1) against exact gossip on the zoo's
ResNet-20 and VGG-16 shapes, 8 peers, in-process and under MPI (`measure.py` the child): bytes,
time per step, the naive and `BEFORE`'s PowerGossip in interleaved blocks, compute efficiency in
situ and for one isolated peer; the kernels; the default VGG-16's bytes (page.md says how)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping

import torch

import topologies
from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import compact, header, on_machine, python_child, quick_mark
from experiments.pages._bench import run_child
from gossip_powersgd.launch import run_peers

#: The commit whose PowerGossip runs beside this tree's: main before Architecture II.
BEFORE = "6df8d52"
#: torus:2x4 has degree 3 (the dimension of size 2 wraps onto the same neighbour), so the page adds
#: an 8-peer graph of degree 4: the circulant C8(1, 2) (Watts-Strogatz with k=4 and no rewiring).
TOPOLOGIES = ("ring:8", "torus:2x4", "small_world:8:4:0")
#: Warm-up PowerGossip steps per variant, and measured exact-gossip steps (after one warm-up step
#: when more than one): VGG-16's exact gossip moves 122 MB per peer and step.
WARMUP_STEPS = {"resnet20": 2, "vgg16": 1, "vgg16_bn": 0}
EXACT_STEPS = {"resnet20": 4, "vgg16": 1, "vgg16_bn": 1}


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
    from .summary import summarize_setting

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
        iso = isolated_benchmark(cfg, topology) if cfg.isolated and not cfg.bytes_only else None
        raw = {"peers": [values[rank] for rank in sorted(values)], "isolated": iso}
        raw["seconds"] = time.perf_counter() - started
    seconds = raw.pop("seconds")
    summary = dict(summarize_setting(cfg, raw["peers"], raw["isolated"]), seconds=seconds)
    return {"summary": summary, "raw": compact(raw)}


def render(rows: Rows) -> Outputs:
    """The page (report.py)."""
    from .report import render_markdown

    kernels = rows.by_key.get("kernels")
    summaries = [r.row["summary"] for r in rows.records if r.key != "kernels"]
    page = render_markdown(summaries, kernels, header(rows), quick_mark(rows))
    return {"bench_gossip.md": page + "\n"}


TITLE = "PowerGossip r1 vs exact gossip on ResNet-20 / VGG-16 shapes: bytes, time, efficiency"
PAGE = register(Page("bench_gossip", TITLE, plan, row, render, serial=True))
