"""Shared fixtures: run a script under mpiexec with a hard timeout, so a deadlock fails, not hangs."""

from __future__ import annotations

import atexit
import os
import signal
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: The helper modules the tests import by name (fixtures, workers, bring-your-own specs such as
#: "byo_fixtures:linear_data") and the scripts they run: on sys.path here, and on the PYTHONPATH
#: of the processes the tests start.
SUPPORT = TESTS / "support"
sys.path.insert(0, str(SUPPORT))

# Bit-equality across transports needs one intra-op thread per peer, and 2 shared cores need it too.
torch.set_num_threads(1)

# Generated datasets (MNIST-1D) are kept on disk once per machine (training/data_cache.py): the
# tests and the programs they start keep theirs in a folder of the session's, not in ~/.cache.
if "GOSSIP_POWERSGD_CACHE" not in os.environ:
    os.environ["GOSSIP_POWERSGD_CACHE"] = tempfile.mkdtemp(prefix="gossip-powersgd-tests-")
    atexit.register(shutil.rmtree, os.environ["GOSSIP_POWERSGD_CACHE"], True)


# ---- launcher markers ------------------------------------------------------------------------------
# A test that starts mpiexec carries @pytest.mark.mpi, one that starts torchrun
# @pytest.mark.torchrun (setup.cfg registers both), so that `pytest -m "not mpi and not torchrun"`
# is a fast inner loop. Every process a test starts is checked: a launch by a test without its
# marker fails that test, naming the marker (also when a fixture it uses does the launching).

#: The test running now (set around each test's set-up, call and tear-down).
_RUNNING: dict = {"item": None}


def launcher_marker(args) -> str | None:
    """ "mpi" for a command that starts mpiexec (or mpirun), "torchrun" for one that starts
    torchrun (or `python -m torch.distributed.run`), else None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    parts = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    if not parts:
        return None
    program = Path(parts[0]).name
    if program in ("mpiexec", "mpirun", "mpiexec.hydra"):
        return "mpi"
    if program == "torchrun" or "torch.distributed.run" in parts[1:3]:
        return "torchrun"
    return None


class _CheckedPopen(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
        item = _RUNNING["item"]
        marker = launcher_marker(args)
        if item is not None and marker is not None and item.get_closest_marker(marker) is None:
            pytest.fail(
                f"{item.nodeid} starts {'mpiexec' if marker == 'mpi' else 'torchrun'} but "
                f"has no @pytest.mark.{marker}: add it (pytest -m 'not {marker}' must "
                "skip every such test)",
                pytrace=False,
            )
        super().__init__(args, *rest, **kwargs)


subprocess.Popen = _CheckedPopen  # subprocess.run and check_output build theirs from this name


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING["item"] = item
    try:
        yield
    finally:
        _RUNNING["item"] = None


def mpiexec_path() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError(
            "mpiexec not found: run the tests through 'make test', which installs mpich"
        )
    return found


class MPIResult(subprocess.CompletedProcess):
    pass


def run_mpi(n: int, args, timeout: float = 120, env=None, cwd=None) -> subprocess.CompletedProcess:
    """Run `python ARGS...` on n ranks; return the completed process (stdout/stderr captured).

    On timeout the whole process group is killed and the test fails naming the command.
    """
    command = [mpiexec_path(), "-n", str(n), sys.executable, *map(str, args)]
    full_env = dict(os.environ)
    full_env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{SUPPORT}"})
    full_env.update(env or {})
    return run_bounded(
        command,
        timeout,
        f"mpiexec -n {n} {' '.join(map(str, args))}",
        env=full_env,
        cwd=cwd or ROOT,
    )


def run_bounded(command, timeout: float, what: str, **popen) -> subprocess.CompletedProcess:
    """Run `command` in a new process group (stdout/stderr captured); past `timeout` the whole
    group is killed and the test fails naming `what` as a hang."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(
            f"{what} did not finish within {timeout} s (a hang):\n{stdout[-2000:]}\n"
            f"{stderr[-2000:]}"
        )
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def no_space_for(monkeypatch, module, name: str) -> None:
    """Make `module.atomic_write` fail with ENOSPC (a full disk) for files named `name`."""
    import errno

    real_write = module.atomic_write

    def atomic_write(path, data, *args, **kwargs):
        if Path(path).name == name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, data, *args, **kwargs)

    monkeypatch.setattr(module, "atomic_write", atomic_write)


def run_scenario_mpi(
    n: int, scenario: str, topology: str, out_dir: Path, timeout: float = 120, extra=()
):
    """Run `module:function` from tests/ under mpiexec via tests/support/mpi_worker.py; return per-rank results."""
    result = run_mpi(
        n, [SUPPORT / "mpi_worker.py", scenario, topology, out_dir, *extra], timeout=timeout
    )
    if result.returncode != 0:
        pytest.fail(
            f"mpi scenario {scenario} failed (exit {result.returncode}):\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return [torch.load(out_dir / f"rank-{k}.pt", weights_only=True) for k in range(n)]


@pytest.fixture
def mpi():
    return run_mpi


def errors_on_every_rank(config, **kwargs):
    """Train `config` on every peer of its topology in one process; each rank's error text (or
    "ok"), leaving out the ranks that a failing peer released from a collective before they raised
    their own (`PeerAborted`: in one process, a failure on one thread may overtake the others in
    the same collective)."""
    import topologies
    from gossip_powersgd import LocalCluster, PeerAborted
    from gossip_powersgd.training.trainer import train

    def peer(comm):
        try:
            train(comm, config, **kwargs)
        except PeerAborted:
            return None
        except Exception as exc:  # noqa: BLE001 - the test compares what every rank saw
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    seen = LocalCluster(topologies.parse(config.topology), timeout=30).run(peer)
    assert any(text is not None for text in seen), seen
    return [text for text in seen if text is not None]


# ---- the tiny config, through the command line and as a config ------------------------------------
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


def cli(argv, capsys):
    """experiments.train's console entry point in this process: (exit code, stderr lines)."""
    from experiments.train import main

    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    return info.value.code, capsys.readouterr().err.strip().splitlines()


def tiny_config(*overrides, deep=False):
    """experiments/configs/tiny.yaml, quiet, with `key=value` overrides."""
    from gossip_powersgd.training.config import load_config

    return load_config(TINY, ["quiet=true", *overrides], deep=deep)


def one_error(errors):
    """The one line every rank reported (the same on all of them)."""
    assert len(set(errors)) == 1 and errors[0] != "ok", errors
    assert "\n" not in errors[0]
    return errors[0]
