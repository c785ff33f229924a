"""`python -m experiments bench_dp`: what DP-SGD costs per step, side by side in one run: (a) one
peer, each clipping engine against the non-private step (and at a big batch), (c) the step in
parts and its tensor operations, (b) ring:8 training with and without DP (page: bench_dp.md)."""

from __future__ import annotations

import functools
import sys
import time
from statistics import median
from typing import Any, Callable, Dict, List, Mapping, Optional
from unittest import mock

import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import gossip_powersgd
from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import converted, header, on_machine, quick_mark, spread
from experiments.pages._markdown import fill, table, table_rows, template
from experiments.suite.runs import BASE
from gossip_powersgd.privacy import DPSGD
from gossip_powersgd.privacy import training as dp_training
from gossip_powersgd.training.hooks import TrainingHooks
from gossip_powersgd.training.models import build_model

MODELS = ("mlp:128,128", "cnn1d")
ENGINES = ("ghost", "vmap", "ew", "hooks")
ALGORITHMS = (("exact gossip", "exact"), ("PowerGossip r1", "powergossip:rank=1,iters=1"))
BATCH = 32
QUICK_DATA = "synthetic_logreg:d=40,classes=10,n=800"
#: The page's run and --quick's (the end-to-end runs of --quick on a small synthetic problem).
SETTING = {
    False: dict(reps=15, steps=20, big_batch=256, e2e_reps=7, e2e_epochs=3, dataset="mnist1d"),
    True: dict(reps=1, steps=1, big_batch=8, e2e_reps=1, e2e_epochs=1, dataset=QUICK_DATA),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- (a) one peer ---------------------------------------------------------------------------
def _one_peer_step(
    spec: str, dp_engine: Optional[str], full: bool, batch: int = BATCH, backward_only: bool = False
) -> Callable[[], None]:
    """One training step of a fresh model; with `dp_engine`, the clipped sum (`full`: the private
    step) replaces the gradient; `backward_only` (for (c)): up to the backward, records dropped."""
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


def _rotated(candidates: Dict[str, Callable[[], None]], rep: int) -> list:
    """The candidates in the order of repetition `rep`, each one place later than in the one before
    (on a loaded machine a fixed order put cnn1d's clipped sum above its whole private step)."""
    items = list(candidates.items())
    shift = rep % len(items)
    return items[shift:] + items[:shift]


def interleaved(
    candidates: Dict[str, Callable[[], None]], reps: int, steps: int
) -> Dict[str, Dict[str, List[float]]]:
    """Per candidate, per repetition: ms per step, thread CPU time and wall time (after 5 warm-up
    steps each: allocator, autograd graphs, lazy imports)."""
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
    return times


def measure_one_peer(spec: str, reps: int, steps: int, batch: int = BATCH):
    """(a): the non-private step, each engine's clipped sum and (at batch 32) the private step."""
    candidates = {"non-private": _one_peer_step(spec, None, False, batch)}
    for engine in ENGINES:
        candidates[f"clipped sum, {engine}"] = _one_peer_step(spec, engine, False, batch)
    for engine in ("ghost", "hooks") if batch == BATCH else ():
        candidates[f"private step, {engine}"] = _one_peer_step(spec, engine, True)
    return interleaved(candidates, reps, steps)


#: The breakdown (c): the step's parts, measured like (a) (forward + backward, then the whole step).
PARTS = {
    "forward + backward, non-private": (None, False, True),
    "forward + backward, ghost": ("ghost", False, True),
    "whole step, non-private": (None, False, False),
    "whole step, clipped sum ghost": ("ghost", False, False),
}


def count_operations(step: Callable[[], None]) -> int:
    """The tensor operations (ATen calls, the backward's included) one call of `step` issues."""

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
    operations = {
        name: count_operations(_one_peer_step(spec, *args))
        for name, args in (
            ("non-private", (None, False)),
            ("clipped sum, ghost", ("ghost", False)),
            ("private step, ghost", ("ghost", True)),
        )
    }
    candidates = {name: _one_peer_step(spec, e, f, BATCH, b) for name, (e, f, b) in PARTS.items()}
    return {"times": interleaved(candidates, reps, steps), "operations": operations}


# ---- (b) end to end -------------------------------------------------------------------------
def _run(
    spec: str, engine: Optional[str], epochs: int, first: int, dataset: str
) -> Dict[str, float]:
    """One ring:8 training run; ms per step (process CPU, wall) from step `first` (at most half the
    run) to the last."""
    overrides = dict(topology="ring:8", partition="iid", epochs=epochs, eval_every=epochs)
    overrides.update(warmup_epochs=0, algorithm=spec, comm_timeout=600.0, dataset=dataset)
    if engine is not None:
        overrides.update(dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_delta=1e-5)
    marks: Dict[int, tuple] = {}

    class Marks(TrainingHooks):
        """Rank 0's process CPU and wall clocks at the end of every step."""

        def after_step(self, step: int, loss) -> None:
            marks[step + 1] = (time.process_time(), time.perf_counter())

    engine_class = functools.partial(DPSGD, engine=engine) if engine is not None else DPSGD
    with mock.patch.object(dp_training, "DPSGD", engine_class):
        gossip_powersgd.run(
            dict(BASE, **overrides), hooks=lambda rank: [Marks()] if rank == 0 else []
        )
    last = max(marks)
    first = min(first, last // 2)
    cpu, wall = ((marks[last][i] - marks[first][i]) / (last - first) * 1e3 for i in (0, 1))
    return {"cpu": cpu, "wall": wall, "steps": last - first, "first": first}


def measure_end_to_end(reps: int, epochs: int, dataset: str, first: int = 8) -> Dict[str, Any]:
    """Per (algorithm, DP engine or None) and repetition, ms per step; the runs interleaved."""
    keys = [(label, engine) for label, _ in ALGORITHMS for engine in (None, "auto", "hooks")]
    times = {key: {"cpu": [], "wall": []} for key in keys}
    result: Dict[str, Any] = {}
    for rep in range(reps):
        for label, engine in keys:
            log(f"  end to end, rep {rep + 1}/{reps}: {label}, DP {engine or 'off'}")
            result = _run(dict(ALGORITHMS)[label], engine, epochs, first, dataset)
            for clock in ("cpu", "wall"):
                times[(label, engine)][clock].append(result[clock])
    return {"times": times, "steps": result["steps"], "first": result["first"]}


# ---- the page -------------------------------------------------------------------------------
def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    return [Run(key="one-peer,parts,end-to-end", config=SETTING[quick])]


@on_machine
def row(run: Run) -> Dict[str, Any]:
    """(a), the big batch, (c) and (b), one after the other, in this process."""
    c = run.config
    torch.set_num_threads(1)
    one_peer, big, parts = {}, {}, {}
    for spec in MODELS:
        log(f"one peer: {spec}")
        one_peer[spec] = measure_one_peer(spec, c["reps"], c["steps"])
    for spec in MODELS:
        log(f"one peer: {spec}, batch {c['big_batch']}")
        big[spec] = measure_one_peer(spec, c["reps"], c["steps"], c["big_batch"])
    for spec in MODELS:
        log(f"one peer: {spec}, the step in parts")
        parts[spec] = measure_parts(spec, c["reps"], c["steps"])
    log("end to end: ring:8, cnn1d")
    e2e = measure_end_to_end(c["e2e_reps"], c["e2e_epochs"], c["dataset"])
    return {
        "one_peer_ms": one_peer,
        "one_peer_big_batch_ms": big,
        "one_peer_parts_ms": {spec: part["times"] for spec, part in parts.items()},
        "one_peer_operations": {spec: part["operations"] for spec, part in parts.items()},
        "end_to_end_ms": {f"{a} | DP {e or 'off'}": v for (a, e), v in e2e["times"].items()},
        "end_to_end_steps": e2e["steps"],
        "end_to_end_first": e2e["first"],
    }


def _ratio(values: List[float], base: List[float]) -> float:
    """The median over repetitions of each repetition's ratio (one repetition's candidates ran back
    to back, under the same load; the ratio of the medians mixes repetitions minutes apart)."""
    return median([v / b for v, b in zip(values, base)])


def _x(times: Dict[str, Dict[str, List[float]]], name: str, base: str = "non-private") -> str:
    """`name`'s CPU time over `base`'s, "1.23×"."""
    return f"{_ratio(times[name]['cpu'], times[base]['cpu']):.2f}×"


def render(rows: Rows) -> Outputs:
    """The page; its fixed text is bench_dp.md beside this file."""
    (record,) = rows.records
    c, data = record.config, record.row
    e2e = {}  # algorithm -> DP engine ("off", "auto", "hooks") -> times
    for key, times in data["end_to_end_ms"].items():
        label, dp = key.split(" | DP ")
        e2e.setdefault(label, {})[dp] = times
    first = data["end_to_end_first"]
    page = fill(
        template(__file__, "bench_dp.md"),
        quick=quick_mark(rows),
        header=header(rows) + ("" if converted(rows) else " One torch thread."),
        page=rows.page,
        batch=BATCH,
        first=first,
        last=first + data["end_to_end_steps"],
        data="MNIST-1D" if c["dataset"] == "mnist1d" else f"`{c['dataset']}`",
        **_one_peer(c, data["one_peer_ms"], data["one_peer_big_batch_ms"]),
        parts=_parts(data["one_peer_parts_ms"], data["one_peer_operations"]),
        end_to_end=_end_to_end(e2e),
        targets=_targets(data["one_peer_ms"], e2e),
        **c,
    )
    return {"bench_dp.md": page}


def _target(what: str, times, name: str, hooks: str, base: str, bound: float) -> str:
    ratio = _ratio(times[name]["cpu"], times[base]["cpu"])
    verdict = "MET" if ratio <= bound else "MISSED"
    return f"- **{what}: {verdict} ({ratio:.2f}×; Opacus' hooks {_x(times, hooks, base)})."


def _targets(one_peer, e2e) -> List[str]:
    """A line per target: met or missed, the ghost engine's ratio and Opacus' hooks'."""
    what = "The clipped sum at ≤ 1.5× a non-private step**, {}, batch " + str(BATCH)
    sums = ("clipped sum, ghost", "clipped sum, hooks", "non-private", 1.5)
    lines = [_target(what.format(spec), t, *sums) for spec, t in one_peer.items()]
    what = "DP training at ≤ 2× the non-private time per step**, ring:8 cnn1d, {}"
    return lines + [_target(what.format(a), t, "auto", "hooks", "off", 2.0) for a, t in e2e.items()]


def _one_peer(c: Dict[str, Any], one_peer, big) -> Dict[str, List[str]]:
    """(a): ms per step at batch 32, the ratios to the non-private step, and the big batch."""
    names = list(next(iter(one_peer.values())))
    steps = [[s, *(spread(t[n]["cpu"]) for n in names)] for s, t in one_peer.items()]
    ratios = [[s, *(f"**{_x(t, n)}**" for n in names[1:])] for s, t in one_peer.items()]
    out = dict(one_peer=table(["model", *names], steps, None), big=[])
    out["ratios"] = table(["model", *names[1:]], ratios, None)
    if big:
        names = list(next(iter(big.values())))
        cells = [
            [s, spread(t["non-private"]["cpu"])]
            + [f"{spread(t[n]['cpu'])} ms, **{_x(t, n)}**" for n in names[1:]]
            for s, t in big.items()
        ]
        out["big"] = ["", f"Batch {c['big_batch']}, the same way (ratios to the non-private step):"]
        out["big"] += ["", *table(["model", "non-private, ms", *names[1:]], cells, None)]
    return out


def _parts(times, operations) -> List[str]:
    """(c): the step in parts, and the tensor operations per step."""
    rows = []
    for spec, part in times.items():
        fb0, fb1, whole0, whole1 = (median(part[name]["cpu"]) for name in PARTS)
        ops = operations[spec]
        extra_ops = ops["clipped sum, ghost"] - ops["non-private"]
        per_op = (whole1 - whole0) * 1e3 / extra_ops if extra_ops > 0 else float("nan")
        ms = (f"{x:.3f} ms" for x in (fb0, fb1, whole0 - fb0, whole1 - fb1))
        counts = (ops[k] for k in ("non-private", "clipped sum, ghost", "private step, ghost"))
        rows.append([spec, *ms, *map(str, counts), f"{per_op:.1f} µs"])
    return table_rows(rows)


def _end_to_end(e2e) -> List[str]:
    """(b): ring:8 training runs, ms per step without DP and with both engines."""
    rows = []
    for label, t in e2e.items():
        cpu = (spread(t[dp]["cpu"]) for dp in ("off", "auto", "hooks"))
        wall = (f"{median(t[dp]['wall']):.1f}" for dp in ("off", "auto", "hooks"))
        rows.append([label, *cpu, f"**{_x(t, 'auto', 'off')}**", _x(t, "hooks", "off"), *wall])
    return table_rows(rows)


TITLE = "what DP-SGD costs per step: clipping engines side by side, private ring:8 training"
PAGE = register(Page("bench_dp", TITLE, plan, row, render, serial=True))
