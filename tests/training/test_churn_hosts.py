"""on_peer_loss: continue across hosts: four hosts of the emulated cluster (prefix `ca...`), one
rank each, ring:4, torchrun on every host (c10d rendezvous on host0, as the README's "Running
across machines"); host 2's rank is SIGKILLed, SIGSTOPped, or host 2's link is cut, mid-run. The
three others find it (a probe refused; silence and a probe its host answers but nobody takes;
silence and no answer), agree through the store on host0, go on over a
group of their own and finish: each prints the new membership, rank 0 the summary, and each one's
torchrun agent says its worker group finished successfully (it then waits in torchrun's exit
barrier for host 2's agent, 300 s: the test ends the agents once that is said).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gossip_powersgd.cluster import network
from gossip_powersgd.cluster.enter import enter_command
from liveness_jobs import TINY, Job, clean_env, rank_pids

N, LOST = 4, 2
BIN = Path(sys.executable).parent
_names = itertools.count()
#: Seconds for four ranks to import torch and set up on 2 shared cores, with room for load.
START_SECONDS = 300
#: Seconds for the rest of the run after the fault: found within the comm timeout's half plus a
#: probe, agreed, the remaining steps, the summary.
END_SECONDS = 240

#: `timing`: the survivors must find the lost host within their 20 s comm timeout, four hosts'
#: processes on 2 cores: run alone (make test's second part), not beside another worker's tests.
pytestmark = [
    pytest.mark.torchrun,
    pytest.mark.timing,
    pytest.mark.skipif(
        bool(network.missing_privileges()),
        reason="making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)",
    ),
]


@pytest.fixture
def prefix():
    """A cluster of N hosts of its own, removed afterwards, whatever happened."""
    name = f"ca{os.getpid() % 10**6}{next(_names)}"
    network.up(name, N, None, {})
    try:
        yield name
    finally:
        network.down(name)
        assert network.owned(name) == []


def _launch(prefix: str, out: Path):
    sets = [
        "backend=torch",
        "on_peer_loss=continue",
        f"topology=ring:{N}",
        f"out_dir={out}",
        "epochs=30",  # 390 steps: the fault at step 39, the survivors blocked until they agree
        "eval_every=100",
        "log_every=0",
        "checkpoint_every=0",
        "comm_timeout=20",
    ]
    program = ["-m", "gossip_powersgd.cli.train", "--config", str(TINY)]
    program += [arg for s in sets for arg in ("--set", s)]
    torchrun = [str(BIN / "torchrun"), "--nnodes", str(N), "--nproc-per-node", "1"]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "host0:29400"]
    env = clean_env({network.PREFIX_ENV: prefix, "LOGLEVEL": "INFO"})
    return [
        Job(enter_command(prefix, f"host{k}", [*torchrun, *program]), env=env) for k in range(N)
    ]


def _said(job: Job, text: str) -> bool:
    return any(text in line for _, line in list(job.out) + list(job.err))


#: How the survivors name the lost rank, per fault: a stopped process's host still completes the
#: probe's connection (nobody accepts it: "hung"); a cut host answers nothing.
HOW = {"kill": "killed", "stop": "hung", "cut": "unreachable"}


@pytest.mark.parametrize("fault", ["kill", "stop", "cut"])
def test_the_survivors_of_a_host_fault_finish_the_run(prefix, fault, tmp_path):
    """`stop`: SIGSTOP; found by its silence, then SIGCONTed once the survivors have agreed to
    go on without it (it learns so from the store and ends itself: it must not disturb them),
    and SIGKILLed at the end whatever it did."""
    out = tmp_path / "run"
    jobs = _launch(prefix, out)
    how = HOW[fault]
    survivors = [k for k in range(N) if k != LOST]
    agreed = f"membership (rank {survivors[0]}): peer {LOST} ({how}) lost"
    try:
        jobs[0].wait_line(r"^progress: step 39/", START_SECONDS)
        pids = {}
        for job in jobs:
            pids.update(rank_pids(job.process.pid))
        assert sorted(pids) == list(range(N)), pids
        if fault == "kill":
            os.kill(pids[LOST], signal.SIGKILL)
        elif fault == "stop":
            os.kill(pids[LOST], signal.SIGSTOP)
        else:  # `ip link set eth0 down` on the host
            network.set_link(prefix, f"host{LOST}", False, at="host")
        finished = "worker group successfully finished"
        deadline = time.monotonic() + END_SECONDS
        continued = fault != "stop"
        while not all(_said(jobs[k], finished) for k in survivors):
            if not continued and _said(jobs[survivors[0]], agreed):
                os.kill(pids[LOST], signal.SIGCONT)
                continued = True
            failed = [k for k in survivors if jobs[k].process.poll() is not None]
            # what the ended or late survivors said (their last lines: torchrun's banner is long)
            late = failed or [k for k in survivors if not _said(jobs[k], finished)]
            assert not failed and time.monotonic() < deadline, {
                k: jobs[k].text()[-4000:] for k in late
            }
            time.sleep(0.2)
        if fault == "stop":  # resumed, it reads the agreement in the store and ends itself
            if not continued:
                os.kill(pids[LOST], signal.SIGCONT)
            gone = "the other peers found this peer lost (hung"
            while not _said(jobs[LOST], gone):
                assert time.monotonic() < deadline, jobs[LOST].text()[-4000:]
                time.sleep(0.2)
    finally:
        for job in jobs:
            job.kill()
        network.signal_host(prefix, f"host{LOST}", signal.SIGKILL)
    for k in survivors:
        assert _said(jobs[k], f"membership (rank {k}): peer {LOST} ({how}) lost"), jobs[k].text()
        assert not any(e.startswith(f"error (rank {k})") for e in jobs[k].errors())
    assert _said(jobs[0], "1 changes, 3 live at the end")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["members_at_end"] == survivors
    assert [(p["peer"], p["how"]) for p in summary["peers_lost"]] == [(LOST, how)]
