"""Launches that several tests share, run once a session (`once`), and the main one of them: a
launch per transport for the tests that compare ring:4 runs across transports.

A launch's cost is its processes' start-up (each imports torch), so the scenarios that the tests
compare bit for bit with the in-process cluster on ring:4 run together, in one launch of 4 ranks
per transport (`ring4_scenarios`), and each test reads its part:

    "contract"     tests/algorithms/test_contract.py's every_algorithm   (mpi, torch)
    "allreduce"    tests/comm/test_base.py's awkward_allreduces           (mpi, torch)
    "exact"        tests/comm/test_local.py's exact_gossip_run            (mpi, torch)
    "power"        tests/algorithms/test_powergossip.py's mpi_scenario    (mpi, torch)
    "rank_valued"  tests/comm/test_local.py's rank_valued_step            (mpi)

`ring4(transport, tmp_path_factory)` launches once a session (`once`, which other tests use for
their own shared launches): under pytest-xdist the first worker that needs a transport's results
launches it while holding a lock in the session's temporary folder, and the others wait for the
lock and read the same files. `ring4_local()` is the same function
run by `LocalCluster` (once a process), what every launch is compared with.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Callable, Dict, List

import torch

_LAUNCHED: Dict[str, List[dict]] = {}
_LOCAL: List[dict] = []
RANKS = 4


def ring4_scenarios(comm) -> dict:
    """Every part, in order, each from freshly reset counters (its bytes are its own)."""
    from tests.algorithms.test_contract import every_algorithm
    from tests.algorithms.test_powergossip import mpi_scenario
    from tests.comm.test_base import awkward_allreduces
    from tests.comm.test_local import exact_gossip_run, rank_valued_step

    out = {}
    for name, scenario in (
        ("contract", every_algorithm),
        ("allreduce", awkward_allreduces),
        ("exact", exact_gossip_run),
        ("power", mpi_scenario),
        ("rank_valued", rank_valued_step),
    ):
        comm.stats.reset()
        out[name] = scenario(comm)
    return out


def ring4_local() -> List[dict]:
    """`ring4_scenarios` on ring:4 in this process (LocalCluster), computed once."""
    if not _LOCAL:
        import topologies
        from gossip_powersgd import LocalCluster

        _LOCAL.extend(LocalCluster(topologies.ring(RANKS)).run(ring4_scenarios))
    return _LOCAL


def once(name: str, tmp_path_factory, launch: Callable[[Path], None]) -> Path:
    """The folder where `launch(folder)` wrote its files, run once a session: under pytest-xdist
    the first worker to ask runs it holding a lock in the session's temporary folder (every
    worker's own is in it), and the others wait for the lock and find the files. A launch that
    fails leaves no mark: the next to ask runs it again."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        if not (folder / "done").exists():
            launch(folder)
            (folder / "done").touch()
    return folder


def ring4(transport: str, tmp_path_factory) -> List[dict]:
    """Each rank's `ring4_scenarios` under `transport` ("mpi" or "torch"), once a session."""
    if transport not in _LAUNCHED:
        folder = once(f"ring4-{transport}", tmp_path_factory, lambda f: _launch(transport, f))
        _LAUNCHED[transport] = [
            torch.load(folder / f"rank-{k}.pt", weights_only=True) for k in range(RANKS)
        ]
    return _LAUNCHED[transport]


def _launch(transport: str, folder) -> None:
    from tests.comm.test_torch import run_torchrun
    from tests.conftest import SUPPORT, run_scenario_mpi

    target, spec = "shared_launches:ring4_scenarios", f"ring:{RANKS}"
    if transport == "mpi":
        run_scenario_mpi(RANKS, target, spec, folder, timeout=180)
    else:
        result = run_torchrun(RANKS, [SUPPORT / "torch_worker.py", target, spec, folder])
        assert result.returncode == 0, result.stderr[-3000:]
