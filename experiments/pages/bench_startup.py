"""`python -m experiments bench_startup`: how soon `gossip-train` speaks, and where its start-up
time goes, under mpiexec and torchrun, next to the launcher alone and `import torch` alone: each
repetition launches every command in turn, stamping rank 0's lines (`MARKS`) with the time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import Any, Dict, List, Mapping

from experiments.engine import ROOT, Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._bench import median, quick_mark, spread
from experiments.pages._markdown import fill, snippets, table

#: (processes, repetitions, the training config's overrides) of the page and of --quick.
SETTING = {
    False: (8, 5, "demo", ["epochs=1", "warmup_epochs=0", "eval_every=1", "checkpoint_every=0"]),
    True: (2, 1, "tiny", ["topology=ring:2", "epochs=1", "checkpoint_every=0"]),
}
#: The lines stamped, in order: (what the page calls it, how rank 0's line starts).
MARKS = (
    ("first line (`start:`)", "start:"),
    ("libraries and config loaded", "set-up: libraries and config loaded"),
    ("config checked", "set-up: config checked"),
    ("model built", "set-up: model "),
    ("first step done", "progress: step 1/"),
)
LAUNCHERS = ("mpiexec", "torchrun")
#: The line each baseline prints (`_commands`).
PREFIXES = {"print": ["line"], "import-torch": ["imported"]}
TEXT = snippets(__file__, "bench_startup.md")


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    processes, repetitions, config, overrides = SETTING[quick]
    setting = dict(processes=processes, repetitions=repetitions, config=config, set=overrides)
    return [Run(key="startup", config=setting, seed=0, cost=repetitions * 4.0)]


def _commands(processes: int, config: str, overrides: List[str]) -> Dict[str, List[str]]:
    """Each launch's command, with "python" and "OUT" (a fresh folder) to fill in."""
    n = str(processes)
    train = ["-m", "gossip_powersgd.cli.train", "--config", config, "--set", "out_dir=OUT"]
    for text in overrides:
        train += ["--set", text]
    launchers = {
        "mpiexec": ["mpiexec", "-n", n, "python"],
        "torchrun": ["torchrun", "--standalone", "--nproc-per-node", n, "--no-python", "python"],
    }
    programs = {
        "print": ["-c", "print('line', flush=True)"],
        "import-torch": ["-c", "import torch; print('imported', flush=True)"],
    }
    commands = {
        f"{k}/{p}": [*launchers[k], *program] for p, program in programs.items() for k in launchers
    }
    commands["mpiexec/train"] = [*launchers["mpiexec"], *train, "--set", "backend=mpi"]
    commands["torchrun/train"] = [*launchers["torchrun"][:-2], *train, "--set", "backend=torch"]
    return commands


def _launch(argv: List[str], prefixes: List[str], env: Dict[str, str], timeout: float):
    """Run `argv`: {"marks": the seconds from its launch to the first line starting with each of
    `prefixes`, and to its exit ("exit")}; a failure is an error with its last lines."""
    start = time.perf_counter()
    options = dict(stdout=PIPE, stderr=STDOUT, text=True, env=env, cwd=ROOT)
    process = subprocess.Popen(argv, **options, start_new_session=True)
    timer = threading.Timer(timeout, os.killpg, (process.pid, signal.SIGKILL))
    timer.start()
    marks: Dict[str, float] = {}
    tail: List[str] = []
    try:
        for line in process.stdout:
            now = round(time.perf_counter() - start, 3)
            marks.update({p: now for p in prefixes if line.startswith(p) and p not in marks})
            tail = (tail + [line.rstrip()])[-5:]
        status = process.wait()
    finally:
        timer.cancel()
    marks["exit"] = round(time.perf_counter() - start, 3)
    if status != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (status {status}): {' / '.join(tail)}")
    return {"marks": marks}


def row(run: Run) -> Dict[str, Any]:
    """Every launch of every repetition, interleaved, stamped (see the module docstring)."""
    setting, launches = run.config, []
    processes = setting["processes"]
    commands = _commands(processes, setting["config"], setting["set"])
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    load = [os.getloadavg()[0]]
    for repetition in range(setting["repetitions"]):
        for kind, command in commands.items():
            with tempfile.TemporaryDirectory(prefix="bench-startup-") as out:
                argv = [a.replace("out_dir=OUT", f"out_dir={out}/run") for a in command]
                argv = [sys.executable if a == "python" else a for a in argv]
                argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
                prefixes = PREFIXES.get(kind.split("/")[1], [p for _, p in MARKS])
                measured = _launch(argv, prefixes, env, 900.0)
                launches.append(dict(measured, kind=kind, repetition=repetition))
    load.append(os.getloadavg()[0])
    shown = dict(
        mpiexec=f"mpiexec -n {processes}", torchrun=f"torchrun --nproc-per-node {processes}"
    )
    lines = {kind: " ".join(f'"{a}"' if " " in a else a for a in c) for kind, c in commands.items()}
    lines = {kind: line.replace("=OUT", "=<a new folder>") for kind, line in lines.items()}
    out = dict(processes=processes, repetitions=setting["repetitions"], kinds=list(commands))
    out.update(commands=shown, command_lines=lines, launches=launches)
    return dict(out, cores=os.cpu_count(), load=load)


def _times(launches: List[Dict[str, Any]], mark: str) -> List[float]:
    return [launch["marks"][mark] for launch in launches if mark in launch["marks"]]


def _verdict(command: str, train, imports, baseline) -> List[str]:
    """When the first line comes under one launcher, against the launcher alone and torch."""
    first, torch_line = _times(train, "start:"), _times(imports, "imported")
    alone = _times(baseline, "line")
    if not (first and torch_line and alone):
        return []
    at, imported = median(first), median(torch_line)
    when = TEXT["before" if at < imported else "after"].format(
        imported=imported, ratio=at / imported
    )
    return [TEXT["verdict"].format(command=command, at=at, alone=median(alone), when=when)]


def render(rows: Rows) -> Outputs:
    """The page: bench_startup.md's `page` filled in."""
    (record,) = rows.records
    data = record.row
    launches = {kind: [r for r in data["launches"] if r["kind"] == kind] for kind in data["kinds"]}
    baseline, imports, train = (
        [launches[f"{k}/{what}"] for k in LAUNCHERS] for what in ("print", "import-torch", "train")
    )
    timed = [  # the table's lines: (what, which launches, the mark timed)
        ("the launcher alone: `python -c print`", baseline, "line"),
        ('`python -c "import torch; print()"`: the first process\'s line', imports, "imported"),
        *((f"gossip-train: {label}", train, mark) for label, mark in MARKS),
        ("gossip-train: every process exited", train, "exit"),
    ]
    head = ["what (rank 0's line)", *(f"`{data['commands'][k]}`" for k in LAUNCHERS)]
    cells = [
        [what, *(spread(t, "-") if (t := _times(g, m)) else "n/a" for g in group)]
        for what, group, m in timed
    ]
    page = fill(
        TEXT["page"],
        quick=quick_mark(rows),
        made_by=made_by(rows),
        table=table(head, cells, None),
        verdict=[
            v
            for k, *g in zip(LAUNCHERS, train, imports, baseline)
            for v in _verdict(data["commands"][k], *g)
        ],
        commands=[f"- `{data['command_lines'][kind]}`" for kind in data["kinds"]],
        **{k: data[k] for k in ("processes", "repetitions", "cores", "load")},
    )
    return {"bench_startup.md": page + "\n"}


TITLE = "start-up of gossip-train under mpiexec and torchrun: first line, set-up phases"
PAGE = register(Page("bench_startup", TITLE, plan, row, render))
