"""Step times of training on an emulated cluster: every host runs the trainer's own loop over the
torch transport, across its rate-limited link, and times it (`training.timing`).

    summary, seconds = step_times(prefix, hosts, spec)       # the cluster `prefix` is up

launches, on every host of cluster `prefix` (one process each, the variables torchrun would set
and no agent beside it: `launch.launch_on_hosts`)

    python -m gossip_powersgd.cluster.step_times SPEC.json OUT_DIR

which, for each algorithm of SPEC (one torch.distributed communicator for all of them), times
the trainer's loop period by period and replays its communication with compute out of the way
(`training.timing.measure_algorithm`), then times and replays one evaluation
(`measure_evaluation`), and writes OUT_DIR/rank-K.json. `summarize` turns the hosts' files into
per-step figures per algorithm and host. SPEC::

    {"train": a training config (its topology: the hosts'), "timeout": comm timeout (s),
     "algorithms": [{"key": name, "spec": algorithm spec, "local_steps": H}, ...],
     "budget": training.timing.Budget's fields, "eval": time the evaluation too (default true)}

`link_check` measures what one TCP stream gets across a link at its rate (`measure.throughput`):
the context a step time needs.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = ["PERIOD_STATISTICS", "link_check", "main", "step_times", "summarize"]

#: A host's per-step figures of an algorithm: a statistic over its periods of a part of each
#: period [wall, arithmetic, communication, CPU seconds].
PERIOD_STATISTICS = {
    "wall": (statistics.median, lambda p: p[0]),
    "wall_mean": (statistics.fmean, lambda p: p[0]),
    "arith": (statistics.median, lambda p: p[1]),
    "comm": (statistics.median, lambda p: p[2]),
    "compute": (statistics.median, lambda p: p[0] - p[1] - p[2]),
    "cpu": (statistics.median, lambda p: p[3]),
    "wall_min": (min, lambda p: p[0]),
    "wall_max": (max, lambda p: p[0]),
}


def main(argv: Optional[List[str]] = None) -> int:
    """One host's part (module docstring): SPEC.json OUT_DIR."""
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    out = Path(args[1])
    import topologies
    import torch

    from gossip_powersgd.launch import make_communicator
    from gossip_powersgd.training.timing import CallRecorder, measure_algorithm, measure_evaluation
    from gossip_powersgd.utils import atomic_write

    torch.set_num_threads(1)
    topology = topologies.parse(spec["train"]["topology"])
    comm = make_communicator("torch", topology, timeout=spec["timeout"])
    recorder = CallRecorder(comm)
    result = {"rank": comm.rank, "host": socket.gethostname(), "algorithms": {}}
    result["load_before"] = list(os.getloadavg())
    timer = None
    for algorithm in spec["algorithms"]:
        config = dict(spec["train"], algorithm=algorithm["spec"], backend="torch")
        config.update(local_steps=algorithm["local_steps"], comm_timeout=spec["timeout"])
        measured, timer = measure_algorithm(comm, recorder, config, spec["budget"])
        result["algorithms"][algorithm["key"]] = measured
    if spec.get("eval", True):
        result["eval"] = measure_evaluation(comm, recorder, timer, spec["budget"])
    result["load_after"] = list(os.getloadavg())
    result["stats"] = comm.stats.as_dict()
    comm.barrier()
    comm.close()
    atomic_write(out / f"rank-{result['rank']}.json", json.dumps(result) + "\n")
    return 0


def step_times(
    prefix: str,
    hosts: int,
    spec: Mapping[str, Any],
    *,
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    limit: float = 4 * 3600.0,
) -> Tuple[Dict[str, Any], float]:
    """`main` on the `hosts` hosts of cluster `prefix` (up already) for `spec` (module
    docstring); `cwd`, `env` and `limit` as `launch_on_hosts` takes them. (`summarize` of the
    hosts' results, the seconds the launch took.)"""
    from gossip_powersgd.cluster.launch import launch_on_hosts

    with tempfile.TemporaryDirectory(prefix="step-times-") as tmp:
        work = Path(tmp)
        (work / "spec.json").write_text(json.dumps(spec))
        command = ["-m", "gossip_powersgd.cluster.step_times", str(work / "spec.json"), tmp]
        seconds = launch_on_hosts(prefix, hosts, command, work, False, cwd, env, limit)
        ranks = [json.loads((work / f"rank-{k}.json").read_text()) for k in range(hosts)]
    return summarize(ranks), seconds


def _algorithm(per: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One algorithm's figures over the hosts' results `per` (each host's, in rank order)."""
    h = per[0]["local_steps"]
    entry = {"local_steps": h, "periods": len(per[0]["periods"])}
    for name, (statistic, part) in PERIOD_STATISTICS.items():
        entry[name] = [statistic(part(p) for p in m["periods"]) / h for m in per]
    return {
        **entry,
        "bytes_sent": [m["per_step"]["bytes_sent"] for m in per],
        "rounds": [m["per_step"]["rounds"] for m in per],
        "critical_bytes": [m["per_step"]["critical_bytes"] for m in per],
        "replay": [max(rep) / h for rep in zip(*(m["replay"] for m in per))],
        "calls": per[0]["calls"],
        "evaluations": [m["evaluations"] for m in per],
        "tcp": {
            phase: {k: sum(m["tcp"][phase][k] for m in per) for k in per[0]["tcp"][phase]}
            for phase in per[0]["tcp"]
        },
    }


def summarize(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Every host's results (rank order) as per-step figures: per algorithm and host, the
    PERIOD_STATISTICS of its periods over its H steps, its bytes, rounds and critical-path bytes
    per step; the replays as the slowest host's time of each; the TCP counters summed over the
    hosts; and the evaluation's seconds, CPU and metric bytes per host, its replays the slowest
    host's."""
    out: Dict[str, Any] = {"algorithms": {}, "hosts": [r["host"] for r in ranks]}
    for key in ranks[0]["algorithms"]:
        out["algorithms"][key] = _algorithm([r["algorithms"][key] for r in ranks])
    if "eval" not in ranks[0]:
        return out
    evals = [r["eval"] for r in ranks]
    out["eval"] = {
        "seconds": [e["seconds"] for e in evals],
        "cpu": [e["cpu"] for e in evals],
        "metric_bytes": [e["metric_bytes"] for e in evals],
        "replay": [max(rep) for rep in zip(*(e["replay"] for e in evals))],
    }
    return out


def link_check(prefix: str, rate: str, seconds: float = 3.0) -> Dict[str, Any]:
    """One TCP stream host1 -> host0 for about `seconds` at `rate` (a tc rate, "10mbit"): the
    payload rate a long transfer gets on this link, {"bytes", "payload_bits"}, or {"bytes",
    "error"} when it fails (the check is context: its failure is said, not raised)."""
    from gossip_powersgd.cluster import parse_rate
    from gossip_powersgd.cluster.measure import throughput

    nbytes = int(min(2e8, max(4e5, parse_rate(rate) / 8 * seconds)))
    try:
        return {
            "bytes": nbytes,
            "payload_bits": throughput(prefix, "host1", "host0", nbytes, 600.0),
        }
    except Exception as exc:
        return {"bytes": nbytes, "error": str(exc).splitlines()[0][:200]}


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(main)
