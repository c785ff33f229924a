"""`python -m experiments bench_backends`: one training run under each backend (`local`, `mpi`,
`torch`), the same config and seed, repetitions interleaved (alternating order); the page says
what is measured (bench_backends.md beside this file)."""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._bench import header, median, mpiexec, on_machine, quick_mark, run_child
from experiments.pages._markdown import fill, table, template

BACKENDS = ("local", "mpi", "torch")
#: The page's run and --quick's.
SETTING = {
    False: dict(config="experiments/configs/ring8_mnist1d_powergossip.yaml", peers=8, reps=2),
    True: dict(config="experiments/configs/tiny.yaml", peers=2, reps=1),
}
SETTING[False].update(set=["epochs=3"], timeout=900.0)
SETTING[True].update(set=["epochs=1", "topology=ring:2"], timeout=300.0)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    s = SETTING[quick]
    return [Run(key=f"{s['config']}/{s['reps']}reps", config=s)]


def command(backend: str, c: Dict[str, Any], out: str) -> List[str]:
    """The training command of one run under `backend`."""
    train = ["-m", "gossip_powersgd.cli.train", "--config", c["config"], "--quiet"]
    for item in [f"backend={backend}", f"out_dir={out}", *c["set"]]:
        train += ["--set", item]
    if backend == "mpi":
        return [mpiexec(), "-n", str(c["peers"]), sys.executable, *train]
    if backend == "torch":
        torchrun = str(Path(sys.executable).parent / "torchrun")
        return [torchrun, "--standalone", "--nproc-per-node", str(c["peers"]), *train]
    return [sys.executable, *train]


def one(backend: str, c: Dict[str, Any], scratch: str, rep: int) -> Dict[str, Any]:
    """One training run: its wall and CPU seconds, training seconds, final models, accuracy."""
    out = Path(scratch) / f"{backend}-{rep}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    status, err = run_child(command(backend, c, str(out)), c["timeout"])
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if status != 0:
        raise RuntimeError(f"{backend} run failed: {err.strip()[-500:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {
        "backend": backend,
        "rep": rep,
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "train_wall_s": summary["wall_time_s"],
        "sha": summary["model_sha256"],
        "acc": summary["final_test_acc_avg_model"],
    }


@on_machine
def row(run: Run) -> Dict[str, Any]:
    """Every repetition of the three backends, interleaved (the order alternates)."""
    c, runs = run.config, []
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(c["reps"]):
            runs += [
                one(b, c, scratch, rep) for b in (BACKENDS if rep % 2 == 0 else BACKENDS[::-1])
            ]
    return {"runs": runs}


def render(rows: Rows) -> Outputs:
    """The page: bench_backends.md filled in."""
    (record,) = rows.records
    c, runs = record.config, record.row["runs"]

    def med(backend, key):
        return median([r[key] for r in runs if r["backend"] == backend])

    keys = ("wall_s", "train_wall_s", "cpu_s")
    cells = [
        [b, *(f"{med(b, k):.1f}" for k in keys), f"{med(b, 'wall_s') / med('local', 'wall_s'):.2f}"]
        for b in BACKENDS
    ]
    page = fill(
        template(__file__, "bench_backends.md"),
        quick=quick_mark(rows),
        header=header(rows),
        overrides=" ".join(c["set"]) or "no overrides",
        table=table("backend | wall (s) | training (s) | CPU (s) | wall ÷ local", cells),
        same="yes" if len({tuple(r["sha"]) for r in runs}) == 1 else "no",
        acc=runs[0]["acc"],
        each="; ".join(
            f"{r['backend']} #{r['rep']}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU"
            for r in runs
        ),
        **c,
    )
    return {"bench_backends.md": page}


TITLE = "one training run under local, mpiexec and torchrun: wall and CPU time, same models"
PAGE = register(Page("bench_backends", TITLE, plan, row, render, serial=True))
