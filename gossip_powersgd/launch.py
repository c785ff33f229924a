"""Entry-point plumbing for scripts that may run under mpiexec or in one process.

`main_guard(main)` runs `main()` and turns an exception into one line on stderr and a non-zero exit
on every rank, never a hang: if every rank failed (a bad config, a disagreement found by a
collective check) each rank exits with its own message; if only some did, the job is aborted with
MPI_Abort so that the others do not wait forever for a peer that is gone.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Callable, Optional, Tuple

from .algorithms.base import NonFiniteError
from .comm.base import AgreementError, CommunicationError

# Errors that describe a problem with the user's input or the run: one line, no traceback.
EXPECTED_ERRORS = (ValueError, KeyError, FileNotFoundError, FileExistsError, IsADirectoryError,
                   PermissionError, AgreementError, CommunicationError, NonFiniteError, ImportError)

# How long a failing rank waits for the others to fail too before it aborts the whole job.
_GRACE_SECONDS = 5.0


def mpi_world() -> Tuple[int, int]:
    """(rank, size) of MPI.COMM_WORLD when MPI is initialised, else (0, 1)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 0, 1
    return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()


def launched_by_mpiexec() -> bool:
    """True when this process is one rank of an mpiexec/mpirun job (MPICH, Open MPI, Slurm PMI)."""
    markers = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
    return any(m in os.environ for m in markers)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, KeyError):
        text = text.strip("'\"")
    return text


def report_and_exit(exc: BaseException, code: int = 1) -> None:
    rank, size = mpi_world()
    prefix = f"error (rank {rank}): " if size > 1 else "error: "
    if not isinstance(exc, EXPECTED_ERRORS) or os.environ.get("GOSSIP_TRACEBACK"):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(prefix + one_line(exc), file=sys.stderr, flush=True)
    if size > 1:
        from mpi4py import MPI

        request = MPI.COMM_WORLD.Ibarrier()
        deadline = time.monotonic() + _GRACE_SECONDS
        while not request.Test():
            if time.monotonic() > deadline:
                MPI.COMM_WORLD.Abort(code)  # some rank is still running: take the job down
            time.sleep(0.01)
    sys.stdout.flush()
    sys.exit(code)


def main_guard(main: Callable[..., Optional[int]], *args, **kwargs) -> None:
    """Run an entry point; exit with its return code, or report its exception as described above."""
    try:
        code = main(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001
        report_and_exit(exc)
        return
    sys.stdout.flush()
    sys.exit(code or 0)
