"""Faults of single hosts under a training run on an emulated cluster, timed from the outside.

    from gossip_powersgd.cluster.soak import soak
    result = soak("tiny.yaml", minutes=1.5, faults=3, seed=0, hosts=4, kinds=KINDS)

One training process per host (``backend: torch``, ``on_peer_loss: continue``, a ring over the
hosts), each started directly with the torch launcher's variables (MASTER_ADDR host0's address,
MASTER_PORT, RANK, WORLD_SIZE), not by torchrun: a torchrun agent waits 300 s in its exit barrier
for a dead host's agent, and an elastic restart renumbers the ranks (a rejoining peer keeps its
id). Host 0 holds the rendezvous store and is never faulted.

`ClusterRun` starts and watches the processes; `inject_fault` makes one fault of one host and
times its cycle: the fault, the survivors' "lost" line on host 0, the host's processes ended and
its link restored, the restart with ``--rejoin``, the members' "rejoins" line, the rejoined
process's "handed its state" line. Kinds (`KINDS`): kill (SIGKILL), stop (SIGSTOP past the comm
timeout's half) and cut (the host's eth0 down). `finish` waits for the processes and reads the
summary (exit statuses, detection-to-continuation per kind); `run_without_faults` is the same
run untouched (the accuracy the faulted one should reach).

`soak` puts them together: the run sized to `minutes` of training without faults (from a probe),
`faults` faults one at a time (this version goes on through one change at a time) at random
pauses, one row per fault as it comes, and a final row next to the run without faults. Needs root
(network namespaces); removes every namespace it made.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

__all__ = [
    "KINDS",
    "ClusterRun",
    "detection_by_kind",
    "finish",
    "inject_fault",
    "pause",
    "progress",
    "check_soak",
    "run_without_faults",
    "soak",
]

#: The package's folder's parent: the hosts' processes import the package this process imports.
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("kill", "stop", "cut")
#: The comm timeout of the runs: a stopped peer is found after half of it.
TIMEOUT = 20.0
#: Seconds one step of the cycle (a line on host 0, a process start) may take on a loaded machine.
WITHIN = 300.0
#: The probe's epochs, from which the soak's epochs are sized to `minutes` without faults.
PROBE_EPOCHS = 200
#: Training past this share of its steps gets no more faults: the end's evaluation is near, and a
#: loss during it ends the run (a stated limit).
LAST_FAULT_AT = 0.85
#: The pauses spread the faults up to this share of the steps, so that the planned count fits
#: before LAST_FAULT_AT (spread up to LAST_FAULT_AT itself, the sixth full soak made 49 of 50:
#: random pauses end past the target about half the time).
FAULTS_AIM_AT = 0.75
LOST = r"membership \(rank 0\): peer (\d+) \((\w+)\) lost"


class ClusterRun:
    """The training processes of one run of `config` (a YAML file) on cluster `prefix`: one per
    host, their logs in `work` (hostK.out, hostK.err; a restart's name "K-rejoinI")."""

    def __init__(self, prefix: str, hosts: int, work: Path, epochs: int, config: Path):
        self.prefix, self.n, self.work, self.epochs = prefix, hosts, work, epochs
        self.config = Path(config).resolve()
        self.processes: Dict[str, subprocess.Popen] = {}
        self.out = work / "run"
        work.mkdir(parents=True, exist_ok=True)

    def command(self, k: int, rejoin: bool = False):
        """(argv, environment) of host k's process, before it enters the host."""
        from gossip_powersgd.cluster import network

        sets = ["backend=torch", "on_peer_loss=continue", f"topology=ring:{self.n}"]
        sets += [f"out_dir={self.out}", f"epochs={self.epochs}"]
        # one evaluation, at the end (a loss during one ends it)
        sets += [f"eval_every={self.epochs}", "log_every=0", "checkpoint_every=0"]
        sets += [f"comm_timeout={TIMEOUT:g}"]
        program = [sys.executable, "-m", "gossip_powersgd.cli.train", "--config", str(self.config)]
        program += [a for s in sets for a in ("--set", s)] + (
            ["--rejoin", str(k)] if rejoin else []
        )
        env = {key: v for key, v in os.environ.items() if key != "RANK"}
        env.update(MASTER_ADDR=network.address(0), MASTER_PORT="29500", WORLD_SIZE=str(self.n))
        env.update(RANK=str(k), LOCAL_RANK="0", OMP_NUM_THREADS="1")
        return program, dict(env, PYTHONPATH=str(_PACKAGE_ROOT))

    def start(self, k: int, rejoin: bool = False, tag: str = "") -> None:
        from gossip_powersgd.cluster.enter import enter_command

        program, env = self.command(k, rejoin)
        with open(self.work / f"host{k}{tag}.out", "w") as out:
            with open(self.work / f"host{k}{tag}.err", "w") as err:
                self.processes[f"{k}{tag}"] = subprocess.Popen(
                    enter_command(self.prefix, f"host{k}", program),
                    env=env,
                    cwd=self.work,
                    stdout=out,
                    stderr=err,
                )

    def text(self, name: str = "0") -> str:
        return (self.work / f"host{name}.out").read_text()

    def wait_for(self, pattern: str, count: int = 1, name: str = "0") -> float:
        """Until host `name`'s output (host 0's, or "K-rejoinI") holds `count` matches of
        `pattern`: time.time() then."""
        deadline = time.monotonic() + WITHIN
        while len(re.findall(pattern, self.text(name))) < count:
            ended = [n for n in {"0", name} if self.processes[n].poll() is not None]
            if time.monotonic() > deadline or ended:
                tail = (self.work / "host0.err").read_text()[-1500:] + self.text()[-1500:]
                raise RuntimeError(f"soak: no {pattern!r} (#{count}) on host 0: {tail}")
            time.sleep(0.05)
        return time.time()

    def end(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()


def inject_fault(run: ClusterRun, k: int, kind: str, index: int) -> Dict[str, Any]:
    """Fault `index` (0, 1, ...) of the run: host `k` killed, stopped or cut (`kind`), then
    brought back with --rejoin (module docstring). Its row: how the survivors named it, whether
    they named the right peer, and the seconds from the fault to their membership line, to the
    readmission and to the rejoined process training (its state handed over)."""
    from gossip_powersgd.cluster import network

    started = time.time()
    if kind == "cut":
        network.set_link(run.prefix, f"host{k}", False, at="host")
    else:
        sig = signal.SIGKILL if kind == "kill" else signal.SIGSTOP
        network.signal_host(run.prefix, f"host{k}", sig)
    lost = run.wait_for(LOST, index + 1)
    network.signal_host(run.prefix, f"host{k}", signal.SIGKILL)  # what is left of it
    if kind == "cut":
        network.set_link(run.prefix, f"host{k}", True, at="host")
    run.start(k, rejoin=True, tag=f"-rejoin{index}")
    back = run.wait_for(r"membership \(rank 0\): peer \d+ rejoins", index + 1)
    # its state handed over the new group: the change is complete (a loss before ends the run)
    training = run.wait_for(r"handed its state", 1, f"{k}-rejoin{index}")
    said = re.findall(LOST, run.text())[index]
    return {
        "fault": index,
        "host": k,
        "kind": kind,
        "found_as": said[1],
        "right_peer": int(said[0]) == k,
        "to_membership_line_s": lost - started,
        "to_readmission_s": back - started,
        "to_training_s": training - started,
    }


def detection_by_kind(summary: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Per way a peer was lost ("killed", "stopped", "unreachable": the summary's
    ``peers_lost``), the median and max seconds from its detection to training on, and their
    count; a way with no measured continuation is left out."""
    per_kind = {}
    for how in sorted({p["how"] for p in summary["peers_lost"]}):
        seconds = [
            p["detection_to_continuation_s"]
            for p in summary["peers_lost"]
            if p["how"] == how and p["detection_to_continuation_s"] is not None
        ]
        if seconds:
            per_kind[how] = {
                "median_s": statistics.median(seconds),
                "max_s": max(seconds),
                "n": len(seconds),
            }
    return per_kind


def finish(run: ClusterRun, faults: int, seconds: float) -> Dict[str, Any]:
    """Wait for every process (`seconds` in all at most), read the summary: the final row (exit
    statuses by process name, None for one still running; members at the end; detection to
    continuation per kind; accuracy, steps and wall time)."""
    codes, deadline = {}, time.monotonic() + seconds
    for name, process in run.processes.items():
        try:
            codes[name] = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[name] = None
    summary = json.loads((run.out / "summary.json").read_text())
    return {
        "final": True,
        "faults": faults,
        "exit_codes": codes,
        "members_at_end": summary["members_at_end"],
        "membership_changes": summary["membership_changes"],
        "detection_to_continuation": detection_by_kind(summary),
        "final_test_acc_avg_model": summary["final_test_acc_avg_model"],
        "steps": summary["steps"],
        "wall_time_s": summary["wall_time_s"],
    }


def run_without_faults(
    prefix: str, hosts: int, epochs: int, work: Path, seconds: float, config: Path
) -> Dict[str, Any]:
    """The same run without faults: its accuracy, steps and wall time (`seconds`: the longest it
    may take)."""
    run = ClusterRun(prefix, hosts, work, epochs, config)
    try:
        for k in range(hosts):
            run.start(k)
        for name, process in run.processes.items():
            if process.wait(timeout=seconds) != 0:
                raise RuntimeError(f"soak: the run without faults failed on host {name}")
    finally:
        run.end()
    summary = json.loads((run.out / "summary.json").read_text())
    return {
        "acc": summary["final_test_acc_avg_model"],
        "steps": summary["steps"],
        "wall_s": summary["wall_time_s"],
    }


def progress(text: str) -> float:
    """The share of its steps a run's output says it has made (its last progress line; 0
    before the first)."""
    found = re.findall(r"progress: step (\d+)/(\d+)", text)
    return int(found[-1][0]) / int(found[-1][1]) if found else 0.0


def pause(rng: random.Random, text: str, seconds: float, left: int, cycles: List[float]) -> float:
    """Seconds to wait before the next fault: random in [0, 2 x slack], where slack spreads the
    time training has left before FAULTS_AIM_AT over the `left` faults, less one fault's mean
    cycle so far (20 s before the first). The time left is the run without faults' (`seconds`)
    for the share of steps left: the soak's own rate so far is no guide (a fault stalls it)."""
    remaining = max(0.0, FAULTS_AIM_AT - progress(text)) * seconds
    cycle = statistics.mean(cycles) if cycles else 20.0
    return rng.uniform(0.0, 2.0 * max(0.0, remaining / max(left, 1) - cycle))


def _faults(run, rng, faults, reference, hosts, kinds, sink) -> List[Dict[str, Any]]:
    """The soak's faults on a started `run`, each row also to `sink` as it comes."""
    rows: List[Dict[str, Any]] = []
    cycles: List[float] = []
    for index in range(faults):
        time.sleep(pause(rng, run.text(), reference["wall_s"], faults - index, cycles))
        if progress(run.text()) > LAST_FAULT_AT:
            break
        kind = kinds[index % len(kinds)] if kinds else rng.choice(KINDS)
        rows.append(inject_fault(run, rng.randrange(1, hosts), kind, index))
        cycles.append(rows[-1]["to_readmission_s"])
        if sink:
            sink.write(json.dumps(rows[-1]) + "\n")
            sink.flush()
    return rows


def _soaked(prefix, config, minutes, faults, rng, hosts, kinds, sink, tmp: Path):
    """The probe, the run without faults and the soak in `tmp`: (rows, final, reference, epochs)."""
    # seconds per epoch here, from 200 epochs (20 gave 45 steps/s where the run made 83)
    probe = run_without_faults(prefix, hosts, PROBE_EPOCHS, tmp / "probe", WITHIN * 4, config)
    epochs = max(20, int(minutes * 60 / (probe["wall_s"] / PROBE_EPOCHS)))
    # a loaded machine: 23.5 min for a run the probe sized to 20 (the churn page's first try)
    longest = WITHIN + 4 * minutes * 60
    reference = run_without_faults(prefix, hosts, epochs, tmp / "reference", longest, config)
    run = ClusterRun(prefix, hosts, tmp / "soak", epochs, config)
    try:
        for k in range(hosts):
            run.start(k)
        run.wait_for(r"progress: step 1/")
        rows = _faults(run, rng, faults, reference, hosts, kinds, sink)
        return rows, finish(run, len(rows), longest), reference, epochs
    finally:
        run.end()


def soak(
    config: Path,
    minutes: float,
    faults: int,
    seed: int,
    out_jsonl=None,
    hosts: int = 6,
    kinds: Optional[Sequence[str]] = None,
    prefix: Optional[str] = None,
) -> Dict[str, Any]:
    """The soak (module docstring) of `config` (a YAML file): `faults` faults over a run of about
    `minutes` of training without faults on `hosts` hosts of a cluster made for it (`prefix`,
    default "cr" and this process's id), random hosts and kinds from `seed` (or `kinds` in
    turn); each row also to `out_jsonl` as it comes. Returns {"rows", "final"}. A soak that cannot
    run (`check_soak`) or a rows file that cannot be opened fails before the cluster is made;
    on Ctrl-C, SIGTERM or SIGHUP its processes are killed and its cluster removed."""
    from gossip_powersgd.cluster import network

    check_soak(config, minutes, faults, hosts, kinds)
    rng = random.Random(seed)
    prefix = prefix or f"cr{os.getpid() % 10**5}"
    with network.exits_on_termination():  # SIGTERM, SIGHUP: the cleanup below runs
        load_before = os.getloadavg()
        sink = open(out_jsonl, "w") if out_jsonl else None  # before the cluster: nothing to undo
        try:
            network.up(prefix, hosts, None, {})  # (a failed one removes what it made)
        except BaseException:
            if sink:
                sink.close()
            raise
        try:
            # the hosts' logs: removed after a soak that ends well, kept (and named) after one that
            # does not (the third full soak ended with a rejoined host's process gone and no log)
            with tempfile.TemporaryDirectory(prefix="churn-soak-") as tmp, _kept_on_error(tmp):
                rows, final, reference, epochs = _soaked(
                    prefix, config, minutes, faults, rng, hosts, kinds, sink, Path(tmp)
                )
            final.update(hosts=hosts, epochs=epochs, seed=seed, comm_timeout_s=TIMEOUT)
            final.update(
                reference_test_acc_avg_model=reference["acc"],
                reference_steps=reference["steps"],
                reference_wall_time_s=reference["wall_s"],
                load_before=list(load_before),
                load_after=list(os.getloadavg()),
                cpus=os.cpu_count(),
            )
            if sink:
                sink.write(json.dumps(final) + "\n")
        finally:
            if sink:
                sink.close()
            for k in range(hosts):
                network.signal_host(prefix, f"host{k}", signal.SIGKILL)
            network.down(prefix)
    return {"rows": rows, "final": final}


def check_soak(config, minutes: float, faults: int, hosts: int, kinds) -> None:
    """A one-line ValueError for a soak that cannot run, before any cluster is made."""
    if not Path(config).is_file():
        raise ValueError(f"soak: config {str(config)!r} is not a file: give a training YAML file")
    if not hosts >= 2:
        raise ValueError(f"soak: hosts={hosts}: give at least 2 (host 0 is never faulted)")
    if not minutes > 0 or faults < 0:
        raise ValueError(f"soak: minutes={minutes}, faults={faults}: give minutes > 0, faults >= 0")
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown:
        raise ValueError(f"soak: unknown fault kinds {unknown}: give some of {list(KINDS)}")


@contextlib.contextmanager
def _kept_on_error(tmp: str):
    try:
        yield
    except BaseException:
        kept = tempfile.mkdtemp(prefix="churn-soak-failed-")
        shutil.copytree(tmp, kept, dirs_exist_ok=True)
        print(f"soak: the hosts' logs are kept in {kept}", file=sys.stderr, flush=True)
        raise
