"""A fault on one host of an emulated cluster, mid-run, timed: the scenario of
tests/faults/test_liveness_hosts.py (which asserts the bound and the messages) and of the bandwidth
page's fault rows (which record the times), written once here.

Three hosts (`python -m gossip_powersgd.cluster`), one rank each, ring:3 on the tiny config,
launched as the README's "Running across machines" does: torchrun on every host (c10d rendezvous
on host0), or mpiexec on host0 with a hostfile and gossip-cluster-ssh. Once rank 0 printed
"epoch 1/", host 1 gets its fault:

- cut: `ip link set eth0 down` on the host;
- kill: its rank's process SIGKILLed;
- stop: every process of the host SIGSTOPped;
- kill-all: every process of the host SIGKILLed (torchrun: its agent too).

`run_fault` returns when each rank that can still run (a stopped host's cannot) ended, counted
from the fault, and every `error (rank R): ...` line the launchers printed.

As a program (the bandwidth page): `python tests/support/host_faults.py PREFIX LAUNCHER FAULT
OUT.json` makes cluster PREFIX, runs the fault, writes the result as JSON and removes the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":  # run as a program: the checkout and this folder on the path
    sys.path[:0] = [str(HERE.parents[1]), str(HERE)]

from liveness_jobs import LONG_RUN, TINY, Job, alive, clean_env, rank_pids  # noqa: E402

from gossip_powersgd.cluster import network  # noqa: E402
from gossip_powersgd.cluster.enter import enter_command  # noqa: E402
from gossip_powersgd.faults import monitor  # noqa: E402

N = 3
LOST = 1
FAULTS = ("cut", "kill", "stop", "kill-all")
#: Seconds a launcher takes to end what is left once a rank ended, with room for load.
LAUNCHER_SECONDS = 5.0
#: Seconds after the fault by which every rank that can run must be gone for a result at all.
WITHIN = 90.0
BIN = Path(sys.executable).parent
#: What the other ranks say of host 1, per fault (the liveness monitor's diagnosis).
SAYS = {
    "cut": "is unreachable: no heartbeat for",
    "kill": "is gone: its process ended without a word",
    "stop": "though its host answers: it is stopped or hung",
    "kill-all": "is gone",
}


def host_fault_bound() -> float:
    """When every rank still able to run must be gone after a fault on another host: silent for
    `SILENT_SECONDS` (from a heartbeat up to a look late), probed for up to `PROBE_SECONDS`, then
    `SPEAK_SECONDS` for the others to say it and a look, a look's time for the launcher to pass
    the lines on (`Monitor._end`), then the launcher."""
    m = monitor
    return (
        m.SILENT_SECONDS
        + 2 * m.CHECK_SECONDS
        + m.PROBE_SECONDS
        + m.SPEAK_SECONDS
        + 2 * m.CHECK_SECONDS
        + LAUNCHER_SECONDS
    )


def label(k: int) -> str:
    """How a rank names host k: "host1 (10.x.y.z)"."""
    return f"host{k} ({network.address(k)})"


def launch(prefix: str, launcher: str, work: Path) -> List[Job]:
    """The jobs of a ring:3 run, one rank per host (torchrun: one job per host)."""
    backend = "mpi" if launcher == "mpi" else "torch"
    sets = [f"backend={backend}", f"topology=ring:{N}", f"out_dir={work / 'run'}", *LONG_RUN]
    program = ["-m", "gossip_powersgd.cli.train", "--config", str(TINY)]
    program += [arg for s in sets for arg in ("--set", s)]
    env = clean_env({network.PREFIX_ENV: prefix})
    if launcher == "mpi":
        hostfile = work / "hosts.txt"
        hostfile.write_text("".join(f"host{k}\n" for k in range(N)))
        argv = [str(BIN / "mpiexec"), "-f", str(hostfile), "-n", str(N), "-launcher", "ssh"]
        argv += ["-launcher-exec", str(BIN / "gossip-cluster-ssh"), sys.executable, *program]
        return [Job(enter_command(prefix, "host0", argv), env=env)]
    torchrun = [str(BIN / "torchrun"), "--nnodes", str(N), "--nproc-per-node", "1"]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "host0:29400"]
    return [
        Job(enter_command(prefix, f"host{k}", [*torchrun, *program]), env=env) for k in range(N)
    ]


def inject(prefix: str, fault: str, pids: Dict[int, int]) -> None:
    host = f"host{LOST}"
    if fault == "cut":  # `ip link set eth0 down` on the host
        network.set_link(prefix, host, False, at="host")
    elif fault == "kill":
        os.kill(pids[LOST], signal.SIGKILL)
    elif fault == "stop":
        network.signal_host(prefix, host, signal.SIGSTOP)
    elif fault == "kill-all":
        network.signal_host(prefix, host, signal.SIGKILL)
    else:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")


def exit_times(pids: Dict[int, int], since: float, within: float) -> Dict[int, Optional[float]]:
    """{rank: seconds from `since` (monotonic) until its process ended, None past `within`}."""
    ended: Dict[int, Optional[float]] = {}
    deadline = since + within
    while len(ended) < len(pids) and time.monotonic() <= deadline:
        for rank, pid in pids.items():
            if rank not in ended and not alive(pid):
                ended[rank] = time.monotonic() - since
        time.sleep(0.02)
    return {rank: ended.get(rank) for rank in sorted(pids)}


def started(jobs: List[Job], within: float) -> None:
    """Until rank 0 printed its first epoch; raises AssertionError (with the jobs' output) past
    `within` seconds or as soon as a job ended before it."""
    deadline = time.monotonic() + within
    while True:
        try:
            jobs[0].wait_line(r"^epoch 1/", 1.0)
            return
        except AssertionError:
            ended = [job for job in jobs if job.process.poll() is not None]
            if ended or time.monotonic() > deadline:
                job = (ended or jobs)[0]
                why = "a launcher ended" if ended else f"within {within:g} s"
                raise AssertionError(
                    f"rank 0 printed no 'epoch 1/' line ({why}):\n{job.text()}"
                ) from None


def run_fault(prefix: str, launcher: str, fault: str, work: Path) -> Dict:
    """Host 1's fault mid-run on cluster `prefix` (N hosts, made by the caller): {"seconds":
    until the last rank that can run ended (None: not within WITHIN), "exits": {rank: seconds},
    "named_after": seconds to the first error line, "errors": the error lines, "pids"}."""
    jobs = launch(prefix, launcher, work)
    try:
        started(jobs, 300)
        pids: Dict[int, int] = {}
        for job in jobs:
            pids.update(rank_pids(job.process.pid))
        assert sorted(pids) == list(range(N)), pids
        faulted = time.monotonic()
        inject(prefix, fault, pids)
        running = {k: p for k, p in pids.items() if fault != "stop" or k != LOST}
        exits = exit_times(running, faulted, WITHIN)
    finally:
        for job in jobs:
            job.kill()
        network.signal_host(prefix, f"host{LOST}", signal.SIGKILL)
    times = list(exits.values())
    named = [t for t in (job.first_error_after(faulted) for job in jobs) if t is not None]
    return {
        "seconds": None if None in times else max(times),
        "exits": exits,
        "named_after": min(named, default=None),
        "errors": [e for job in jobs for e in job.errors()],
        "pids": pids,
    }


def names_the_host(errors: List[str], rank: int, fault: str) -> bool:
    """Whether every error line of `rank` names host 1 (peer, host name and address) with the
    fault's diagnosis, and there is one."""
    lines = [e for e in errors if e.startswith(f"error (rank {rank}): ")]
    lost = f"peer {LOST} on host {label(LOST)}"
    return bool(lines) and all(lost in e and SAYS[fault] in e for e in lines)


def main(argv: List[str]) -> int:
    prefix, launcher, fault, out = argv
    network.up(prefix, N, None, {})
    try:
        with tempfile.TemporaryDirectory(prefix=f"host-fault-{launcher}-{fault}-") as work:
            result = run_fault(prefix, launcher, fault, Path(work))
    finally:
        network.down(prefix)
    result["bound"] = host_fault_bound()
    result["left"] = network.owned(prefix)
    errors = result["errors"]
    result["named"] = {k: names_the_host(errors, k, fault) for k in range(N) if k != LOST}
    said = [e for e in errors if e.startswith(f"error (rank {LOST}): ")]
    result["lost_says"] = said[0] if said else None
    Path(out).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
