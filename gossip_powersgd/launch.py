"""Entry-point plumbing for scripts that may run under mpiexec or in one process.

`run_peers(topology, fn, backend=...)` runs a function on every peer, whatever the transport, so that
an experiment is written once for one process and for mpiexec. `main_guard(main)` runs `main()` and turns an exception into one line on stderr and a non-zero exit
on every rank, never a hang: if every rank failed (a bad config, a disagreement found by a
collective check) each rank exits with its own message; if only some did, the job is aborted with
MPI_Abort so that the others do not wait forever for a peer that is gone.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from .errors import AgreementError, CommunicationError, NonFiniteError
from .utils import one_line, write_stderr_line

if TYPE_CHECKING:
    from topologies import Topology

    from .comm.base import Communicator

# Errors that describe a problem with the user's input or the run: one line, no traceback. OSError
# covers a read-only or full disk and a path that is not a directory (its text names the path).
# A KeyError is not one: no check raises it, so one that gets here is a bug, and its traceback shows.
EXPECTED_ERRORS = (
    ValueError,
    OSError,
    MemoryError,
    AgreementError,
    CommunicationError,
    NonFiniteError,
    ImportError,
)

#: Exit status after Ctrl-C, as a shell reports a process ended by SIGINT.
INTERRUPTED_EXIT = 130


def mpi_world() -> Tuple[int, int]:
    """(rank, size) of MPI.COMM_WORLD when MPI is initialised, else (0, 1)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 0, 1
    return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()


def torch_world() -> Tuple[int, int]:
    """(rank, size) of the default torch.distributed group when one is running, else (0, 1)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def launched_by_torchrun() -> bool:
    """True when torchrun (or a launcher setting its variables by hand) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ
    )


def torchrun_world_size() -> int:
    """WORLD_SIZE when torchrun (or a launcher setting its variables) started this process, else 1."""
    if not launched_by_torchrun():
        return 1
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def local_under_torchrun_error(world_size: int) -> ValueError:
    """The one line for backend local in one of torchrun's processes: each would run every peer
    and all would then fight over the run directory's lock, which is all a user would see."""
    return ValueError(
        f"backend local runs every peer as a thread of one process, but torchrun "
        f"started {world_size} processes (WORLD_SIZE={world_size}): use --set "
        "backend=torch, or run without torchrun"
    )


#: The launchers' variables naming this process's rank and the number of processes, in the order
#: they are read: MPICH/Hydra (and Slurm's PMI), Open MPI, torchrun.
LAUNCHER_RANK_VARS = (
    ("PMI_RANK", "PMI_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("RANK", "WORLD_SIZE"),
)


def launched_rank() -> Optional[Tuple[int, int]]:
    """(rank, number of processes) as the launcher's environment states them, read before MPI or
    torch.distributed is initialised; None outside a launcher (or one that sets none of
    `LAUNCHER_RANK_VARS`: PMIx alone, whose size only MPI_Init tells)."""
    for rank_var, size_var in LAUNCHER_RANK_VARS:
        if rank_var in os.environ and size_var in os.environ:
            try:
                return int(os.environ[rank_var]), int(os.environ[size_var])
            except ValueError:
                return None
    return None


def launched_by_mpiexec() -> bool:
    """True when this process is one rank of an mpiexec/mpirun job (MPICH, Open MPI, Slurm PMI)."""
    markers = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
    return any(m in os.environ for m in markers)


#: The transports, by the name the CLIs and configs use (`TrainConfig.backend` too).
BACKENDS = ("mpi", "local", "torch")


def _fix(backend: str, cli: Optional[str]) -> str:
    return f"--set backend={backend}" if cli else f"backend {backend}"


def launch_command(backend: str, n: Any = "N", cli: Optional[str] = None) -> str:
    """The command that starts `n` peers of backend mpi or torch (`cli`: the module run)."""
    python = Path(sys.executable).name if cli else "python"
    module = cli or "..."
    if backend == "mpi":
        return f"mpiexec -n {n} {python} -m {module} ..."
    return f"torchrun --nproc-per-node {n} -m {module} ..."


def resolve_backend(backend: Optional[str], *, cli: Optional[str] = None, n: Any = "N") -> str:
    """`backend`, or for None / "auto" the one this process was started for: "mpi" under mpiexec
    with more than one rank, "torch" under torchrun, else "local". A backend whose launcher is
    missing (or a local one inside a multi-process job) is refused with the command that works:
    `cli` names the module the user runs (the fix is then spelled ``--set backend=...``), `n` the
    number of peers. The one set of launcher checks of the CLI, `run_peers` and the experiments."""
    if backend in (None, "auto"):
        if launched_by_mpiexec() and _mpi_world_size() > 1:
            return "mpi"
        return "torch" if launched_by_torchrun() else "local"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}, auto")
    if backend == "mpi" and not launched_by_mpiexec() and launched_by_torchrun():
        raise ValueError(
            f"backend mpi runs one peer per MPI rank, but torchrun started this "
            f"process: add {_fix('torch', cli)} (torch.distributed, the same "
            f"numbers), or launch with {launch_command('mpi', n, cli)}"
        )
    if backend == "mpi" and not launched_by_mpiexec():
        raise ValueError(
            f"backend mpi runs one peer per MPI rank: launch with "
            f"{launch_command('mpi', n, cli)}, or use {_fix('local', cli)}"
        )
    if backend == "torch" and not (launched_by_torchrun() or launched_by_mpiexec()):
        raise ValueError(
            f"backend torch runs one peer per process: launch with "
            f"{launch_command('torch', n, cli)}, or use {_fix('local', cli)}"
        )
    if backend == "local" and launched_by_mpiexec() and _mpi_world_size() > 1:
        raise ValueError(
            f"backend local runs every peer as a thread of one process; do not "
            f"launch it with mpiexec -n {_mpi_world_size()} (or use "
            f"{_fix('mpi', cli)})"
        )
    if backend == "local" and torchrun_world_size() > 1:
        raise local_under_torchrun_error(torchrun_world_size())
    return backend


def _mpi_world_size() -> int:
    from .comm.mpi import _mpi  # initialises MPI, the GIL released (see comm/mpi_world.py)

    return _mpi().COMM_WORLD.Get_size()


def launched_world_size(backend: str) -> int:
    """How many processes the launcher of `backend` started (1 for local)."""
    if backend == "mpi":
        return _mpi_world_size()
    if backend == "torch":
        from .comm.torch import launcher_environment

        return launcher_environment()[1]
    return 1


def make_communicator(
    backend: str, topology: "Topology", *, timeout: Optional[float] = None, device: str = "cpu"
) -> "Communicator":
    """This process's communicator for a launched backend (mpi or torch), checking that the
    launcher started as many processes as `topology` has peers."""
    world = launched_world_size(backend)
    if topology.size != world:
        launcher = "mpiexec" if backend == "mpi" or not launched_by_torchrun() else "torchrun"
        raise ValueError(
            f"topology {topology.name!r} has {topology.size} peers but {launcher} "
            f"started {world} processes: start {topology.size}"
        )
    if backend == "mpi":
        from .comm.mpi import MPICommunicator

        return MPICommunicator(topology, timeout=timeout)
    if backend == "torch":
        from .comm.torch import TorchCommunicator

        return TorchCommunicator(topology, device=device, timeout=timeout)
    raise ValueError(
        f"backend {backend!r} has no communicator per process (local runs every "
        "peer in this one: run_peers)"
    )


def run_peers(
    topology: "Topology",
    fn: Callable[..., Any],
    *args,
    backend: Optional[str] = "local",
    timeout: Optional[float] = None,
    device: str = "cpu",
    **kwargs,
) -> Dict[int, Any]:
    """Run `fn(comm, *args, **kwargs)` on every peer of `topology`; return {rank: value}.

    backend "local": every peer is a thread of this process (`LocalCluster`); the dict holds every
    rank's value. backend "mpi": this process is one rank of an mpiexec job (`MPICommunicator` on
    COMM_WORLD, whose size must be the topology's); backend "torch": one process of a torchrun (or
    mpiexec) job (`TorchCommunicator`, gloo on the CPU, NCCL with `device` cuda); the dict then
    holds this rank's value only, so `results.get(0)` is rank 0's value on rank 0 and None
    elsewhere, under either backend. None or "auto" picks the backend this process was launched
    for (see `resolve_backend`). `timeout` is the communicator's (seconds a peer may wait for a
    message). The one transport builder of the CLI and the experiments.
    """
    backend = resolve_backend(backend)
    if backend in ("mpi", "torch"):
        comm = make_communicator(backend, topology, timeout=timeout, device=device)
        value = fn(comm, *args, **kwargs)
        if hasattr(comm, "close"):
            comm.barrier()  # every peer is done with the group before any leaves it
            comm.close()
        return {comm.rank: value}
    from .comm.local import LocalCluster

    values = LocalCluster(topology, timeout=timeout).run(fn, *args, **kwargs)
    return dict(enumerate(values))


#: How torch words a failed allocation: the CPU allocator ("you tried to allocate N bytes") and
#: CUDA's ("Tried to allocate 20.00 GiB").
_ALLOCATION = re.compile(
    r"(?:you tried to allocate (\d+) bytes|[Tt]ried to allocate ([\d.]+ [KMGT]i?B))"
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed: a MemoryError, torch's OutOfMemoryError, or the
    RuntimeError torch's CPU allocator raises."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _asked(text: str) -> str:
    match = _ALLOCATION.search(text)
    if match is None:
        return ""
    if match.group(1):
        size = int(match.group(1))
        return (
            f"an allocation of {size / 1e9:.4g} GB failed"
            if size >= 1e8
            else (f"an allocation of {size} bytes failed")
        )
    return f"an allocation of {match.group(2)} failed"


def error_line(exc: BaseException) -> str:
    """The one line a user sees for `exc`; an allocation that failed (a MemoryError, often without
    a message, or torch's allocator errors) says what ran out and the size asked."""
    if is_out_of_memory(exc):
        detail = str(exc).strip()
        asked = _asked(detail)
        if asked:
            detail = asked
        elif detail:
            detail = f"({detail.splitlines()[0]})"
        return (
            "out of memory"
            + (f": {detail}" if asked else f" {detail}" if detail else "")
            + ": use a smaller model, batch size or number of peers per machine"
        )
    if isinstance(exc, KeyError):
        # Its text is only the missing key's repr ("error: 0" said nothing): name what it is.
        key = exc.args[0] if len(exc.args) == 1 else exc.args
        return (
            f"internal error: KeyError {key!r} (a lookup of a missing key; please report it "
            "with the command that caused it)"
        )
    return one_line(exc)


def report_and_exit(exc: BaseException, code: int = 1) -> None:
    from . import faults

    if faults.handled():  # a lost peer, already named: this error is its consequence
        faults.finish(code)
    rank, size = mpi_world()
    torch_rank, torch_size = torch_world()
    if size == 1 and torch_size > 1:
        rank, size = torch_rank, torch_size
    shown = (rank, size) if size > 1 else launched_rank() or (0, 1)  # before MPI starts too
    prefix = f"error (rank {shown[0]}): " if shown[1] > 1 else "error: "
    expected = isinstance(exc, EXPECTED_ERRORS) or is_out_of_memory(exc)
    if not expected or os.environ.get("GOSSIP_TRACEBACK"):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    write_stderr_line(prefix + error_line(exc))
    if torch_size > 1 and mpi_world()[1] == 1:
        from .comm.torch import exit_after_peers

        exit_after_peers(code)
    if size > 1:
        from .comm.mpi import exit_or_abort

        exit_or_abort(code)
    sys.stdout.flush()
    sys.exit(code)


def _exit_interrupted() -> None:
    """Ctrl-C: one line and status 130. Peer threads were told to stop (`LocalCluster.run`); files
    are only ever replaced whole, so nothing half-written is left behind."""
    rank, size = mpi_world()
    if size == 1:
        rank, size = torch_world()
    prefix = f"rank {rank}: " if size > 1 else ""
    print(
        f"{prefix}interrupted (Ctrl-C); files already written are complete, nothing was left "
        "half-written",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    if threading.active_count() > 1:
        # A peer thread still inside a long computation: leave without waiting for it, since the
        # interpreter's shutdown would otherwise tear down native threads under it (exit 134).
        os._exit(INTERRUPTED_EXIT)
    sys.exit(INTERRUPTED_EXIT)


def _show_run_warnings() -> None:
    """Show a `utils.RunWarning` as one line, ``warning: ...`` (``warning (rank K): ...`` when
    launched), in one write; any other warning as Python shows it."""
    import warnings

    from .utils import RunWarning

    shown = warnings.showwarning
    if getattr(shown, "run_warnings", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, RunWarning):
            return shown(message, category, filename, lineno, file, line)
        rank, size = mpi_world()
        if size == 1:
            rank, size = torch_world()
        write_stderr_line((f"warning (rank {rank}): " if size > 1 else "warning: ") + str(message))

    show.run_warnings = True
    warnings.showwarning = show


def main_guard(main: Callable[..., Optional[int]], *args, **kwargs) -> None:
    """Run an entry point; exit with its return code, or report its exception as described above."""
    _show_run_warnings()
    try:
        code = main(*args, **kwargs)
    except KeyboardInterrupt:
        _exit_interrupted()
        return
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001
        report_and_exit(exc)
        return
    sys.stdout.flush()
    sys.exit(code or 0)
