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

`once(name, tmp_path_factory, launch, ranks)` runs a launch once a session and gives each rank's
results: under pytest-xdist the first worker that needs them launches while holding a lock in the
session's temporary folder, and the others wait for the lock and read the same files.
`in_process(name, topology, function)` is the in-process run they are compared with (LocalCluster,
once a process). `ring4(transport, tmp_path_factory)` and `ring4_local()` are the two for ring:4.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Callable, Dict, List

import torch

_LAUNCHED: Dict[str, List[dict]] = {}
_LOCAL: Dict[str, List[dict]] = {}
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


def once(name: str, tmp_path_factory, launch: Callable[[Path], None], ranks: int) -> List[dict]:
    """Each rank's results (`rank-K.pt`) of `launch(folder)`, launched once a session: under
    pytest-xdist the first worker to ask runs it holding a lock in the session's temporary folder
    (every worker's own is in it), and the others wait for the lock and read the files. A launch
    that fails leaves no mark: the next to ask runs it again."""
    if name not in _LAUNCHED:
        base = tmp_path_factory.getbasetemp()
        folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
        folder.mkdir(exist_ok=True)
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
            if not (folder / "done").exists():
                launch(folder)
                (folder / "done").touch()
        _LAUNCHED[name] = [
            torch.load(folder / f"rank-{k}.pt", weights_only=True) for k in range(ranks)
        ]
    return _LAUNCHED[name]


def in_process(name: str, topology, function: Callable, **cluster_options) -> List[dict]:
    """`function` on every peer of `topology` in this process (LocalCluster), computed once."""
    if name not in _LOCAL:
        from gossip_powersgd import LocalCluster

        _LOCAL[name] = LocalCluster(topology, **cluster_options).run(function)
    return _LOCAL[name]


def ring4(transport: str, tmp_path_factory) -> List[dict]:
    """Each rank's `ring4_scenarios` under `transport` ("mpi" or "torch"), once a session."""
    return once(f"ring4-{transport}", tmp_path_factory, lambda f: _launch(transport, f), RANKS)


def ring4_local() -> List[dict]:
    """`ring4_scenarios` on ring:4 in this process."""
    import topologies

    return in_process("ring4", topologies.ring(RANKS), ring4_scenarios)


def _launch(transport: str, folder) -> None:
    from tests.comm.test_torch import run_torchrun
    from tests.conftest import SUPPORT, run_scenario_mpi

    target, spec = "shared_launches:ring4_scenarios", f"ring:{RANKS}"
    if transport == "mpi":
        run_scenario_mpi(RANKS, target, spec, folder, timeout=180)
    else:
        result = run_torchrun(RANKS, [SUPPORT / "torch_worker.py", target, spec, folder])
        assert result.returncode == 0, result.stderr[-3000:]
