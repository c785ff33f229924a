"""Training jobs under mpiexec or torchrun for the liveness tests: start one, find its ranks'
processes, wait for a line, stop or kill a rank, time the end.

Every line the job writes is kept with the time it was read, so that a test reports when each rank
spoke; the job runs in its own session, and `kill` ends all of it.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SUPPORT = TESTS / "support"
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"

#: A run long enough for any test to stop it (the test ends it), evaluating once an epoch (the
#: "epoch 1/" line marks mid-run) and checkpointing rarely.
LONG_RUN = ("epochs=2000", "checkpoint_every=1000", "eval_every=1")


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This environment without any launcher's variables, one thread per process."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL", "TORCHELASTIC_", "HYDI_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(map(str, (ROOT, TESTS, SUPPORT)))}
    )
    env.update(extra or {})
    return env


def train_command(
    launcher: str, n: int, out_dir: Path, overrides: Sequence[str] = (), port: int = 0
) -> List[str]:
    """`mpiexec -n N` or `torchrun --nproc-per-node N` running the training program on tiny."""
    program = ["-m", "gossip_powersgd.cli.train", "--config", str(TINY)]
    backend = "mpi" if launcher == "mpi" else "torch"
    sets = [f"backend={backend}", f"topology=ring:{n}", f"out_dir={out_dir}", *overrides]
    program += [arg for s in sets for arg in ("--set", s)]
    if launcher == "mpi":
        from tests.conftest import mpiexec_path

        return [mpiexec_path(), "-n", str(n), sys.executable, *program]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(n),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *program,
    ]


class Job:
    """A launched command whose output lines are timed as they are read."""

    def __init__(self, command: Sequence[str], env=None, cwd=ROOT):
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env() if env is None else env,
            cwd=cwd,
            start_new_session=True,
        )
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.out: List[tuple] = []  # (seconds since start, line) of stdout
        self.err: List[tuple] = []  # the same of stderr
        self.readers = [
            threading.Thread(target=self._pump, args=(s, keep), daemon=True)
            for s, keep in ((self.process.stdout, self.out), (self.process.stderr, self.err))
        ]
        for reader in self.readers:
            reader.start()

    def _pump(self, stream, keep):
        for line in stream:
            keep.append((time.monotonic() - self.started, line))
            if keep is self.out:
                self.lines.put(line)

    def wait_line(self, pattern: str, within: float) -> str:
        """The first stdout line matching `pattern`; raises AssertionError past `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} within {within} s:\n{self.text()}"
                ) from None
            if re.search(pattern, line):
                return line

    def rank_pids(self, n: int, within: float = 60) -> Dict[int, int]:
        """{rank: pid} of the processes that train (the deepest one of each rank), once all n
        have started."""
        deadline = time.monotonic() + within
        while True:
            pids = rank_pids(self.process.pid)
            if len(pids) == n or time.monotonic() > deadline:
                assert len(pids) == n, f"ranks found: {pids}\n{self.text()}"
                return pids
            time.sleep(0.05)

    def wait(self, within: float) -> Optional[float]:
        """Seconds until the launcher ended, or None if it is still running after `within`."""
        started = time.monotonic()
        try:
            self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - started

    def first_error_after(self, since: float) -> Optional[float]:
        """Seconds from `since` (monotonic) to this job's first `error (rank` line after it."""
        self.drain()
        times = [self.started + t - since for t, line in self.err if line.startswith("error (rank")]
        times = [t for t in times if t >= 0]
        return min(times) if times else None

    def errors(self) -> List[str]:
        self.drain()
        return [line.strip() for _, line in self.err if line.startswith("error (rank")]

    def drain(self) -> None:
        for reader in self.readers:
            reader.join(timeout=10)

    def text(self) -> str:
        return "".join(line for _, line in sorted(self.out + self.err))[-6000:]

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()


def _children() -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(parent, []).append(int(name))
    return kids


def rank_pids(root: int) -> Dict[int, int]:
    """{rank: pid} below process `root` (PMI_RANK or RANK in the environment), the deepest
    process of each rank (a supervised rank's child, which trains)."""
    kids, ranks, depth = _children(), {}, {}
    stack = [(root, 0)]
    while stack:
        pid, level = stack.pop()
        for child in kids.get(pid, []):
            stack.append((child, level + 1))
            try:
                with open(f"/proc/{child}/environ", "rb") as f:
                    variables = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            rank = variables.get(b"PMI_RANK", variables.get(b"RANK"))
            if rank is not None and rank.isdigit() and level + 1 >= depth.get(int(rank), 0):
                ranks[int(rank)], depth[int(rank)] = child, level + 1
    return ranks


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def all_gone(pids, within: float) -> bool:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def last_gone(pids, since: float, within: float) -> Optional[float]:
    """Seconds from `since` (monotonic) until the last of `pids` ended, or None past `within`."""
    deadline = since + within
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return time.monotonic() - since
