"""One program on every host of an emulated cluster, and the wait for all of them.

    seconds = launch_on_hosts("gp", 4, ["-m", "gossip_powersgd.cli.train", "--config", "c.yaml"],
                              logs=Path("logs"))

Each host runs `python COMMAND` (one process): under torchrun (multi-node, c10d rendezvous on
host0), as a user launches across hosts, or (`torchrun=False`) started with the variables
torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR host0), without an agent per host beside the
processes (what a timing wants). A host that fails ends the others; its log's tail is the error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .enter import enter_command
from .network import PREFIX_ENV

RENDEZVOUS_PORT = 29400


def _host_command(k: int, hosts: int, command: Sequence[str], torchrun: bool, port: int):
    """(argv, the variables it adds) of host k."""
    if torchrun:
        words = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", str(hosts)]
        words += ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint"]
        return [*words, f"host0:{port}", *command], {}
    variables = dict(RANK=str(k), LOCAL_RANK="0", WORLD_SIZE=str(hosts))
    variables.update(MASTER_ADDR="host0", MASTER_PORT=str(port))
    return [sys.executable, *command], variables


def launch_on_hosts(
    prefix: str,
    hosts: int,
    command: Sequence[str],
    logs: Path,
    torchrun: bool = True,
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    limit: float = 4 * 3600.0,
    grace: float = 30.0,
    port: int = RENDEZVOUS_PORT,
) -> float:
    """`python COMMAND` on host0 .. host{hosts-1} of cluster `prefix` (each one's output in
    LOGS/hostK.log; `env`: their variables, default this process's). Returns the seconds until
    the last one ended. Raises RuntimeError when one fails (the others get `grace` seconds to
    notice and end, then are killed) or when they run past `limit` seconds (all killed); a
    ClusterError, with no host started, when the cluster lacks one of them."""
    base = dict(os.environ if env is None else env, **{PREFIX_ENV: prefix})
    # every host checked before any starts: a cluster too small for `hosts` starts nothing
    starts = []
    for k in range(hosts):
        argv, variables = _host_command(k, hosts, command, torchrun, port)
        starts.append((enter_command(prefix, f"host{k}", argv), dict(base, **variables)))
    processes: List[subprocess.Popen] = []
    start = time.perf_counter()
    try:
        for k, (argv, variables) in enumerate(starts):
            with open(Path(logs) / f"host{k}.log", "w") as log:
                processes.append(
                    subprocess.Popen(
                        argv,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=cwd,
                        env=variables,
                        start_new_session=True,
                    )
                )
    except BaseException:  # a host that cannot start (its cwd, its log): end those started
        _end(processes)
        raise
    failed, first = _wait(processes, limit, grace)
    seconds = time.perf_counter() - start
    bad = [k for k, p in enumerate(processes) if p.returncode != 0]
    if failed or bad:
        k = first if first is not None else bad[0] if bad else 0
        tail = (Path(logs) / f"host{k}.log").read_text()[-1500:]
        raise RuntimeError(f"launch on the cluster failed ({failed or f'host{k}'}): {tail}")
    return seconds


def _wait(processes: List[subprocess.Popen], limit: float, grace: float):
    """Until every process ended, one failed (then `grace` seconds more) or `limit` passed;
    whatever still runs then is killed. (What went wrong or None, the host that failed first.)"""
    deadline = time.monotonic() + limit
    failed = first = None
    try:
        while any(p.poll() is None for p in processes):
            if time.monotonic() > deadline:
                failed = f"still running after {limit:.0f} s"
                break
            bad = [k for k, p in enumerate(processes) if p.poll() not in (None, 0)]
            if bad:
                first = bad[0]
                failed = f"host{bad[0]} exited with status {processes[bad[0]].returncode}"
                ended = time.monotonic() + grace  # the others name it and end themselves
                while any(p.poll() is None for p in processes) and time.monotonic() < ended:
                    time.sleep(0.2)
                break
            time.sleep(0.2)
    finally:
        _end(processes)
    return failed, first


def _end(processes: List[subprocess.Popen]) -> None:
    """Kill whatever of `processes` still runs, with everything it started (its session)."""
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


def train_on_hosts(
    prefix: str,
    config: Mapping[str, Any],
    *,
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    limit: float = 4 * 3600.0,
) -> Tuple[Dict[str, Any], List[Dict[str, Any]], float]:
    """`config` (a training config, backend torch: one host per peer of its topology) trained by
    `gossip-train` under torchrun on every host of cluster `prefix`, as a user runs it (`cwd`,
    `env`, `limit` as `launch_on_hosts` takes them; its out_dir is replaced by a temporary one).
    (The run's summary, rank 0's evaluation records, the seconds the launch took.)"""
    import topologies
    import yaml

    hosts = topologies.parse(config["topology"]).size
    with tempfile.TemporaryDirectory(prefix="train-on-hosts-") as tmp:
        work = Path(tmp)
        (work / "run.yaml").write_text(yaml.safe_dump(dict(config, out_dir=str(work / "run"))))
        command = ["-m", "gossip_powersgd.cli.train", "--config", str(work / "run.yaml")]
        seconds = launch_on_hosts(prefix, hosts, command, work, True, cwd, env, limit)
        summary = json.loads((work / "run" / "summary.json").read_text())
        lines = (work / "run" / "metrics" / "rank-0.jsonl").read_text().splitlines()
    evals = [r for r in map(json.loads, lines) if r.get("kind") == "eval"]
    return summary, evals, seconds
