"""Entry-point plumbing for scripts that may run under mpiexec or in one process.

`run_peers(topology, fn, backend=...)` runs a function on every peer, whatever the transport, so that
an experiment is written once for one process and for mpiexec. `main_guard(main)` runs `main()` and turns an exception into one line on stderr and a non-zero exit
on every rank, never a hang: if every rank failed (a bad config, a disagreement found by a
collective check) each rank exits with its own message; if only some did, the job is aborted with
MPI_Abort so that the others do not wait forever for a peer that is gone. `collectively(comm, fn)`
runs a check whose outcome may differ between ranks and raises the first failing rank's line on
every rank.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from .comm.transports import (  # noqa: F401 (the launcher environment; re-exported)
    TRANSPORTS,
    launched_by_mpiexec,
    launched_by_torchrun,
    local_under_torchrun_error,
    mpi_world_size,
    torchrun_world_size,
    transport,
)
from .errors import AgreementError, CommunicationError, NonFiniteError
from .utils import one_line, warn, write_stderr_line

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


def __getattr__(name: str) -> Any:
    """`BACKENDS`: the transports by the name the CLIs and configs use (`TrainConfig.backend`), the
    names registered in `comm.transports.TRANSPORTS` when asked (a later registration counts)."""
    if name == "BACKENDS":
        return TRANSPORTS.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: What ``backend: auto`` falls back to when no launcher started this process.
DEFAULT_BACKEND = "local"


def intra_op_threads(requested: int) -> int:
    """`threads`, at most the CPUs this process may run on (one warning line when clamped: far
    more threads than CPUs only contend, and 100000 of them crash torch). What gossip-train and
    `run()` give `torch.set_num_threads`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    if requested <= cpus:
        return requested
    warn(
        f"threads {requested} exceeds the {cpus} CPUs this process may use: using {cpus} "
        "(torch intra-op threads)"
    )
    return cpus


def launch_command(backend: str, n: Any = "N", cli: Optional[str] = None) -> str:
    """The command that starts `n` peers of a launched backend (`cli`: the module run)."""
    return transport(backend).command(n, cli)


def resolve_backend(backend: Optional[str], *, cli: Optional[str] = None, n: Any = "N") -> str:
    """`backend`, or for None / "auto" the one this process was started for (the first transport
    whose `detect` says so: "mpi" under mpiexec with more than one rank, "torch" under torchrun),
    else "local". A backend whose launcher is missing (or a local one inside a multi-process job)
    is refused with the command that works (`Transport.check_started`): `cli` names the module the
    user runs (the fix is then spelled ``--set backend=...``), `n` the number of peers. The one set
    of launcher checks of the CLI, `run_peers` and the experiments."""
    if backend in (None, "auto"):
        return next((t.name for t in TRANSPORTS if t.detect()), DEFAULT_BACKEND)
    if backend not in TRANSPORTS:
        raise ValueError(
            f"unknown backend {backend!r}; valid: {', '.join(TRANSPORTS.names())}, auto"
        )
    transport(backend).check_started(cli, n)
    return backend


def launched_world_size(backend: str) -> int:
    """How many processes the launcher of `backend` started (1 for local)."""
    return transport(backend).world_size()


def make_communicator(
    backend: str, topology: "Topology", *, timeout: Optional[float] = None, device: str = "cpu"
) -> "Communicator":
    """This process's communicator for a launched backend (mpi or torch), checking that the
    launcher started as many processes as `topology` has peers."""
    return transport(backend).connect(topology, timeout, device)


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
    message). The one transport builder of the CLI and the experiments: the transport's entry
    (`comm.transports`) runs the peers.
    """
    backend = resolve_backend(backend)
    return transport(backend).run_peers(topology, fn, args, kwargs, timeout, device)


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


#: Bytes of an error message shared with every peer (see `collectively`).
_MESSAGE_BYTES = 1024


def collectively(comm: Communicator, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """Run `fn` on every peer; if it failed on any, raise the same ValueError on every peer.

    The message is the first failing rank's (in rank order), so every rank, under either transport,
    reports the same one line. Used for checks whose outcome may differ between ranks (files on disk).
    """
    error: Optional[BaseException] = None
    result = None
    try:
        result = fn(*args, **kwargs)
    except CommunicationError:
        raise
    except (ValueError, KeyError, OSError, RuntimeError, TypeError, MemoryError) as exc:
        error = exc
    text = "" if error is None else error_line(error) or type(error).__name__
    data = text.encode("utf-8")[:_MESSAGE_BYTES]
    # Lengths first, so that the usual outcome (no error anywhere) costs a 4-byte all-gather.
    lengths = comm.allgather_bytes(len(data).to_bytes(4, "little"))
    longest = max(int.from_bytes(n, "little") for n in lengths)
    if longest:
        for message in comm.allgather_bytes(data.ljust(longest, b"\0")):
            message = message.rstrip(b"\0")
            if message:
                raise ValueError(message.decode("utf-8", errors="replace"))
    return result


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
    if max(torch_size, torchrun_world_size()) > 1 and mpi_world()[1] == 1:  # set up or not
        from .comm.torch import exit_after_peers

        exit_after_peers(code)
    if size > 1:
        from .comm.mpi import exit_or_abort

        exit_or_abort(code)
    sys.stdout.flush()
    sys.exit(code)


def _exit_failed(exc: SystemExit) -> None:
    """`sys.exit(N)` (N not 0) out of the run's own code (a hook, the dataset, the model) on a
    process of a torch job under on_peer_loss: continue: a failure, as an exception is
    (`report_and_exit`), not a goodbye. Its line, then `comm.torch.exit_after_peers`: the others
    go on without it at once (they used to take its end for a clean one, wait out comm_timeout,
    then fail). Status 0 (or None) is a clean end; under abort its end is told as before (the
    others name it: `TorchCommunicator._tell_exit`)."""
    from . import faults

    code, monitor = exc.code, faults.current()
    if code is None or code == 0 or monitor is None or monitor.policy != "continue":
        return
    if max(torch_world()[1], torchrun_world_size()) <= 1 or mpi_world()[1] > 1:
        return
    if faults.handled():  # a lost peer, already named: its end is told already
        return
    status = code if isinstance(code, int) else 1
    why = f"exited with status {status}" if isinstance(code, int) else str(code)
    write_stderr_line(
        f"error (rank {monitor.rank}): {why} (SystemExit raised by the run's code: a hook, the "
        "dataset or the model)"
    )
    from .comm.torch import exit_after_peers

    exit_after_peers(status)


def _exit_interrupted() -> None:
    """Ctrl-C: one line and status 130. Peer threads were told to stop (`LocalCluster.run`); files
    are only ever replaced whole, so nothing half-written is left behind. A process of a job under
    on_peer_loss: continue names itself lost (`faults.fail`): one interrupted alone is a failure."""
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
    from . import faults

    faults.fail()  # under on_peer_loss: continue, its peers go on without it (not "killed")
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
    except SystemExit as exc:
        _exit_failed(exc)
        raise
    except BaseException as exc:  # noqa: BLE001
        report_and_exit(exc)
        return
    sys.stdout.flush()
    from . import faults

    if faults.ended_by_loss():  # the rank said "ending the job": no success, whatever main says
        faults.finish(code or 1)
    monitor = faults.current()
    if monitor is not None and monitor.policy == "continue" and (monitor.removed or _rejoined()):
        _exit_without_finalizing(code or 0)
    sys.exit(code or 0)


def _rejoined() -> bool:
    """This is a `gossip-train --rejoin` process: its groups are its members' (`MemberGroup`), and
    gloo's threads of them abort it as the interpreter finalizes, like a survivor's."""
    rejoin = sys.modules.get("gossip_powersgd.comm.torch_rejoin")  # loaded by every --rejoin
    return rejoin is not None and rejoin.rejoining() is not None


def _exit_without_finalizing(code: int) -> None:
    """End a survivor of a lost peer (on_peer_loss: continue), or a process that rejoined, without
    the interpreter's finalization: a thread still inside torch's C++ code as it finalizes (gloo's
    side of the connections to the lost peer) aborts the process after a run that finished,
    "terminate called without an active exception", now and then on a loaded machine.
    The exit functions run first (the communicator's close, the monitor's goodbye, the trackers'),
    every record is already flushed; then os._exit with the run's status."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
