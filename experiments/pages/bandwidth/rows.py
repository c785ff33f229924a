"""The bandwidth page's row function: one run of the plan (`recipe`), by its config's kind. Timed
rows hold an exclusive lock for their whole run and training rows a shared one, so that with
--jobs N nothing of this page runs beside a timed row."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List

from experiments.engine import ROOT, Run
from experiments.pages._suite_rows import spec_of

#: One lock per plan (full, --quick) for every process of every sweep of this page on the machine.
LOCK = Path(tempfile.gettempdir()) / "gossip-powersgd-bandwidth-page-{}.lock"
#: The probe's time budgets (seconds) and limits: training periods, replays, evaluation replays.
PROBE_BUDGET = dict(train=8.0, periods=[3, 40], replay=3.0, replays=[1, 10], eval_replays=[1, 5])
ALONE_BUDGET = {"train": 6.0, "periods": [6, 60], "replay": 0}
#: Seconds a peer waits for a message (an exact-gossip step at 1 Mbit/s on torus:2x4 takes ~110).
COMM_TIMEOUT = 900.0
#: The longest a launch on the cluster may take before it is killed as a hang.
LAUNCH_LIMIT = 4 * 3600.0
PREFIX = "bw"
#: The kinds of rows made on the emulated cluster, and what they are (for the error without it).
ON_THE_CLUSTER = dict(timing="the step times", e2e="the complete runs")
ON_THE_CLUSTER.update(fault="the faults across hosts")
#: How long the link check's one TCP stream runs at the link's rate.
LINK_CHECK_SECONDS = 3.0
#: A fault across hosts: the scenario (tests/faults/test_liveness_hosts.py runs it too), and the
#: longest it may take (start, the fault, the end) before it counts as a hang.
SCENARIO = ROOT / "tests" / "support" / "host_faults.py"
FAULT_LIMIT = 600.0


def row(run: Run) -> Dict[str, Any]:
    """The row of `run` (train, alone, timing, e2e or fault: the `*_row` functions below)."""
    from .recipe import QUICK_BASE

    kind = run.config["kind"]
    make = dict(train=train_row, alone=alone_row, timing=timing_row, e2e=e2e_row, fault=fault_row)
    if kind not in make:
        raise ValueError(f"run {run.key}: unknown kind {kind!r}")
    small = run.config.get("train", {}).get("dataset") == QUICK_BASE["dataset"]
    quick = run.config.get("quick", small)
    with open(str(LOCK).format("quick" if quick else "full"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH if kind == "train" else fcntl.LOCK_EX)  # freed on close
        problem = cluster_problem() if kind in ON_THE_CLUSTER else ""
        if problem and run.config.get("quick"):
            return {"skipped": problem}
        if problem:
            raise RuntimeError(f"{ON_THE_CLUSTER[kind]} need the emulated cluster: {problem}")
        return make[kind](run)


def training_config(run: Run) -> Dict[str, Any]:
    train = dict(run.config["train"], seed=run.seed)
    return dict(train, algorithm=spec_of(train["algorithm"], run.config["gamma"]))


def load() -> List[float]:
    return [round(v, 2) for v in os.getloadavg()]


def timed(before: List[float]) -> Dict[str, Any]:
    """When and where a timed row ran: the load at its start and end, the cores, its niceness."""
    return dict(load_before=before, load_after=load(), cpus=os.cpu_count() or 0, nice=os.nice(0))


def train_row(run: Run) -> Dict[str, Any]:
    """In-process (`gossip_powersgd.run`): accuracy per epoch, bytes, the models' digests."""
    from gossip_powersgd import run as train

    config = training_config(run)
    try:
        result = train(config)
    except Exception as exc:  # a failing or diverging run is a row saying so
        first = (str(exc).strip().splitlines() or [""])[0]
        what = "diverged" if type(exc).__name__ == "NonFiniteError" else type(exc).__name__
        return {"algorithm": config["algorithm"], "error": f"{what}: {first}"[:200]}
    stats, summary = [result.stats[k] for k in sorted(result.stats)], result.summary
    return {
        "algorithm": config["algorithm"],
        **{k: getattr(result, k) for k in ("acc_avg", "acc_local_mean", "acc_local_min", "steps")},
        **{k: summary[k] for k in ("steps_per_epoch", "parameters")},
        "mb_per_peer": result.mb_sent_per_peer,
        "metric_mb_per_peer": statistics.fmean(s["metric_bytes_sent"] for s in stats) / 1e6,
        **{k: max(int(s[k]) for s in stats) for k in ("rounds", "critical_bytes")},
        "evals": [
            [r["step"], r["test_acc_avg_model"], r["mb_sent_per_peer"]] for r in result.evals
        ],
        "model_sha256": summary["model_sha256"],
        "run_seconds": result.wall_seconds,
        "load": load(),
    }


def alone_row(run: Run) -> Dict[str, Any]:
    """One peer's step by itself (`training.timing.measure_alone`): the median period's parts."""
    from gossip_powersgd.training.timing import measure_alone

    before = load()
    measured = measure_alone(dict(run.config["train"], seed=0), ALONE_BUDGET)
    periods, h = measured["periods"], measured["local_steps"]
    parts = dict(wall=lambda p: p[0], arith=lambda p: p[1], echo=lambda p: p[2])
    parts.update(compute=lambda p: p[0] - p[1] - p[2], cpu=lambda p: p[3])
    return {
        "local_steps": h,
        "periods": len(periods),
        **{k: statistics.median(map(part, periods)) / h for k, part in parts.items()},
        "per_step": measured["per_step"],
        **{f"eval_{k}": measured["eval"][k] for k in ("seconds", "cpu", "metric_bytes")},
        **timed(before),
    }


def cluster_problem() -> str:
    from gossip_powersgd.cluster import missing_requirements

    return missing_requirements() or ""


def remove_stale() -> None:
    """Removes this page's clusters whose making process is gone (a killed sweep)."""
    from gossip_powersgd.cluster import down
    from gossip_powersgd.cluster.network import namespaces

    for name in namespaces():
        match = re.fullmatch(rf"({PREFIX}(\d+))-switch", name)
        if match and not Path(f"/proc/{match.group(2)}").exists():
            down(match.group(1))


@contextlib.contextmanager
def cluster(topology: str, rate: str, slow=None) -> Iterator[tuple]:
    """Cluster bw<pid> of `topology`'s hosts at `rate` (`slow`: (host, its rate)), removed after:
    yields its prefix, the hosts and the launch options."""
    import topologies

    from gossip_powersgd.cluster import down, parse_rate, up

    remove_stale()
    prefix, hosts = f"{PREFIX}{os.getpid()}", topologies.parse(topology).size
    up(prefix, hosts, parse_rate(rate), {slow[0]: parse_rate(slow[1])} if slow else {})
    options = dict(cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), limit=LAUNCH_LIMIT)
    try:
        yield prefix, hosts, options
    finally:
        down(prefix)


def timing_row(run: Run) -> Dict[str, Any]:
    """`run`'s step times on a cluster at its rate (`cluster.step_times`), then the link's rate."""
    from gossip_powersgd.cluster.step_times import link_check, step_times

    c, before = run.config, load()
    spec = dict(train=dict(c["train"], seed=0), algorithms=c["algorithms"], timeout=COMM_TIMEOUT)
    spec.update(budget=PROBE_BUDGET, eval=c.get("eval", True))
    with cluster(c["topology"], c["rate"], c["slow"]) as (prefix, hosts, options):
        summary, seconds = step_times(prefix, hosts, spec, **options)
        summary["link"] = link_check(prefix, c["rate"], LINK_CHECK_SECONDS)
    return dict(summary, launch_seconds=seconds, **timed(before))


def fault_row(run: Run) -> Dict[str, Any]:
    """A fault on one of 3 hosts, mid-run: `SCENARIO` on a cluster of this process's prefix (made
    and removed by the scenario), when every rank ended and what each said."""
    remove_stale()
    c, prefix = run.config, f"{PREFIX}{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="bandwidth-fault-") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "log.txt"
        argv = [sys.executable, str(SCENARIO), prefix, c["launcher"], c["fault"], str(out)]
        with open(log, "w") as sink:  # a file, not a pipe: the launchers' children inherit it
            process = subprocess.Popen(
                argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            status = process.wait(timeout=FAULT_LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = None
        if status != 0 or not out.is_file():
            what = "ran past its limit" if status is None else f"exited with status {status}"
            tail = log.read_text()[-1500:]
            raise RuntimeError(f"fault scenario {c['launcher']}/{c['fault']} {what}: {tail}")
        result = json.loads(out.read_text())
    result.pop("pids", None)
    return result


def e2e_row(run: Run) -> Dict[str, Any]:
    """The chosen config trained across a cluster at its rate (`cluster.launch.train_on_hosts`)."""
    from gossip_powersgd.cluster.launch import train_on_hosts

    train, before = training_config(run), load()
    train.update(backend="torch", comm_timeout=COMM_TIMEOUT)
    with cluster(train["topology"], run.config["rate"]) as (prefix, _, options):
        summary, evals, seconds = train_on_hosts(prefix, train, **options)
    keep = ("wall_time_s", "steps", "time_compute_s", "time_gossip_compute_s")
    return {
        "summary": {k: summary[k] for k in keep + ("time_communication_s",)},
        "model_sha256": summary["model_sha256"],
        "acc_avg": summary["final_test_acc_avg_model"],
        "mb_per_peer": summary["mb_sent_per_peer"],
        "evals": [[r["step"], r["wall_time"], r["test_acc_avg_model"]] for r in evals],
        "launch_seconds": seconds,
        **timed(before),
    }
