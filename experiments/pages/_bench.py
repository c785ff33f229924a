"""What the speed pages share (bench_*, long_run, experiments/gpu_check.py): the zoo's parameter
shapes as random tensors, copy bandwidth, a loopback transport, bitwise comparison, the machine a
row was measured on and the header naming it, compact raw numbers, child processes and launchers."""

from __future__ import annotations

import functools
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from subprocess import DEVNULL, PIPE
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from experiments.engine import ROOT, made_by
from gossip_powersgd.comm.base import Communicator
from gossip_powersgd.training.zoo import VGG16, ResNet20

MODELS = ("resnet20", "vgg16", "vgg16_bn")
Shapes = List[Tuple[str, Tuple[int, ...]]]


@functools.lru_cache(maxsize=None)
def _zoo_shapes(model: str) -> Tuple[Tuple[str, Tuple[int, ...]], ...]:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    if model == "resnet20":
        module = ResNet20((3, 32, 32), 10, device="meta")
    else:
        module = VGG16((3, 32, 32), 10, batch_norm=model == "vgg16_bn", device="meta")
    return tuple((name, tuple(p.shape)) for name, p in module.named_parameters())


def model_shapes(model: str) -> Shapes:
    """(name, shape) of the zoo's model for CIFAR-10 inputs, built on the meta device: resnet20,
    vgg16 (`vgg16:bn=false`: no BatchNorm, convs with biases) or vgg16_bn (the zoo's `vgg16`)."""
    return list(_zoo_shapes(model))


def make_params(shapes: Shapes, rank: int):
    """Random float32 tensors of the given shapes, seeded by `rank` (std 1/sqrt(fan-in))."""
    generator = torch.Generator().manual_seed(rank)
    return [
        torch.randn(shape, generator=generator).mul_(max(1, math.prod(shape[1:])) ** -0.5)
        for _, shape in shapes
    ]


def count_params(shapes: Shapes) -> int:
    """Scalars in a parameter set."""
    return sum(math.prod(shape) for _, shape in shapes)


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return float(statistics.median(values)) if values else float("nan")


def spread(values: Sequence[float], dash: str = "–") -> str:
    """ "median (min–max)" to two decimals; `dash` between the ends."""
    return f"{median(values):.2f} ({min(values):.2f}{dash}{max(values):.2f})"


def fmt_bytes(value: float, fmt: str = ".3g") -> str:
    """A byte count in GB, MB, kB (`fmt`ted) or B."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:{fmt}} {unit}"
    return f"{value:.0f} B"


def copy_buffers(megabytes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """A source and a destination of `megabytes` MB for `copy_bandwidth`, touched once."""
    src = torch.ones(megabytes * 2**20 // 4)
    return src, torch.empty_like(src).copy_(src)


def copy_bandwidth(src: torch.Tensor, dst: torch.Tensor) -> float:
    """GB/s of one `dst.copy_(src)` (read + write: 2 x bytes / time)."""
    start = time.perf_counter()
    dst.copy_(src)
    return 2 * src.numel() * 4 / (time.perf_counter() - start) / 1e9


class LoopbackCommunicator(Communicator):
    """Peer `rank` of a topology alone (`LoopbackCommunicator(topology, rank, None)`): every
    neighbour answers at once with half of what we sent it. The algorithm runs its real code path,
    but waits for no peer and shares no core; the few-kB answer counts as communication time."""

    def _exchange(self, send, recv):
        for j in self.neighbors:
            torch.mul(send[j], 0.5, out=recv[j])

    def _allgather_tensor(self, tensor):
        return [tensor.detach().clone() for _ in range(self.size)]


def compare_params(new: Sequence[Any], old: Sequence[Any]) -> Dict[str, Any]:
    """Whether two parameter lists are bit-identical (their bytes: -0.0 differs from 0.0), and
    their largest absolute difference."""

    def raw(t):
        return t.detach().contiguous().view(-1).view(torch.uint8)

    identical = len(new) == len(old) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(raw(a), raw(b))
        for a, b in zip(new, old)
    )
    difference = max(
        (float((a - b).abs().max()) for a, b in zip(new, old) if a.numel()), default=0.0
    )
    return {"identical": identical, "max_difference": difference}


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def machine() -> Dict[str, Any]:
    """CPU, cores, memory, load average (1 minute), Python, torch and MPI versions, now."""
    info = {"cpu": "unknown", "memory": "unknown", "mpi": "MPI: unknown"}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        info["cpu"] = next(
            line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line
        )
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem = next(line.split()[1] for line in meminfo if line.startswith("MemTotal"))
        info["memory"] = f"{int(mem) / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    version = Path(sys.executable).parent / "mpichversion"
    if version.exists():  # without initialising MPI in this process
        text = subprocess.run([str(version)], capture_output=True, text=True, timeout=30).stdout
        info["mpi"] = " ".join(text.strip().splitlines()[0].split()) if text.strip() else "MPI"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    info.update(cores=os.cpu_count(), load=load, niceness=os.nice(0))
    return dict(info, python=platform.python_version(), torch=torch.__version__)


def on_machine(row: Callable[[Any], Dict[str, Any]]) -> Callable[[Any], Dict[str, Any]]:
    """A page's `row` that adds the machine it ran on: `machine_start` and `machine_end`."""

    @functools.wraps(row)
    def measured(run) -> Dict[str, Any]:
        start = machine()
        return dict(row(run), machine_start=start, machine_end=machine())

    return measured


def converted(rows) -> bool:
    """Whether the rows were converted from an older program's files (their header is its own)."""
    return bool(rows.records) and all((r.origin or {}).get("generated") for r in rows.records)


def header(rows) -> str:
    """The page's provenance paragraph: made_by's sentence (converted rows: the old page's own,
    verbatim), and for rows made here the machine around their runs (`on_machine`)."""
    text = made_by(rows)
    starts = [r.row["machine_start"] for r in rows.records if "machine_start" in r.row]
    if converted(rows) or not starts:
        return text
    around = [m for r in rows.records for m in (r.row["machine_start"], r.row["machine_end"])]
    loads = [m["load"] for m in around if m.get("load") is not None]
    m = starts[0]
    load = f"{min(loads):.1f} to {max(loads):.1f}" if loads else "unknown"
    nice = sorted({start.get("niceness") for start in starts} - {None})
    nice = f", run at niceness {', '.join(map(str, nice))}" if nice else ""
    return (
        f"{text} Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; load average {load} at "
        f"the starts and ends of its runs{nice} (the cores are shared with other jobs). Python "
        f"{m['python']}, torch {m['torch']}, {m['mpi']}."
    )


def quick_mark(rows) -> str:
    """A page title's mark for --quick rows."""
    return " (--quick)" if rows.quick else ""


def compact(obj: Any, columns: bool = True) -> Any:
    """Raw numbers made small for a row: floats to 5 significant digits, and (`columns`) lists of
    same-keyed dicts (per-step records) as dicts of lists."""
    if isinstance(obj, float):
        return float(f"{obj:.5g}")
    if isinstance(obj, dict):
        return {k: compact(v, columns) for k, v in obj.items()}
    if not isinstance(obj, (list, tuple)):
        return obj
    records = len(obj) > 1 and all(isinstance(x, dict) for x in obj)
    if columns and records and len({tuple(x) for x in obj}) == 1 and "steps" not in obj[0]:
        return {k: [compact(x[k]) for x in obj] for k in obj[0]}
    return [compact(v, columns) for v in obj]


def run_child(command: List[str], timeout: float) -> Tuple[Optional[int], str]:
    """Run `command` from the checkout in its own session, one torch thread per process, this
    checkout first on the import path: (exit status, its stderr), or (None, why) past `timeout`
    seconds (it and everything it started killed)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    options = dict(cwd=ROOT, env=env, text=True, stdout=DEVNULL, stderr=PIPE)
    child = subprocess.Popen(command, **options, start_new_session=True)
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return None, f"no result within {timeout:g} s"
    except BaseException:  # Ctrl-C: nothing it started outlives the sweep
        os.killpg(child.pid, signal.SIGKILL)
        raise
    return child.returncode, err


def local_torchrun(processes: int) -> List[str]:
    """torchrun (`python -m torch.distributed.run`) of `processes` processes on this machine,
    its rendezvous on a free port of 127.0.0.1; the program and its arguments go after it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    return torchrun + ["--master-addr", "127.0.0.1", "--master-port", port]


def python_child(module: str, args: List[str], backend: str, processes: int) -> List[str]:
    """`python -m module args` as `processes` ranks of `backend` ("mpi": under mpiexec, "torch":
    under torchrun; otherwise one process)."""
    child = [sys.executable, "-m", module, *args]
    if backend == "mpi":
        return [mpiexec(), "-n", str(processes), *child]
    return [*local_torchrun(processes), *child[1:]] if backend == "torch" else child


def mpiexec() -> str:
    """The mpiexec beside this python (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "mpiexec not found next to the python or on PATH (pip install mpich)"
        )
    return found
