"""The MPI process around the transport: initialising MPI, leaving it, and COMM_WORLD notices.

`_mpi` initialises MPI on first use with the GIL released, so that the liveness monitor (`faults`)
runs while MPI_Init waits for every rank; `exit_or_abort` ends a failing rank without leaving the
others waiting; `tell_world_at_exit` and `abort_on_uncaught_exception` make a rank that ends early
(before its communicator exists, or by an uncaught exception) known to the others.
"""

from __future__ import annotations

import atexit
import sys
import time
import traceback
from typing import List

from .. import faults
from ..utils import one_line, write_stderr_line

# On COMM_WORLD itself, for a rank that ends before it created any MPICommunicator (see
# `tell_world_at_exit`): no other communicator is shared yet.
_WORLD_EXIT_TAG = 32_123
# What a notice says happened to its culprit: it ended its process.
_EXITED = 1.0

#: How long a failing rank waits for the other ranks to fail too before it aborts the whole job: the
#: same wait as a rank's that fails before its transport is set up.
GRACE_SECONDS = faults.EXIT_GRACE_SECONDS


def exit_or_abort(code: int) -> None:
    """End this rank with `code`; if some rank is still running after GRACE_SECONDS, abort the job.

    Every failing rank enters a non-blocking barrier. When all ranks failed (a bad config found by a
    collective check), all reach it and exit with their own message; when only some did, the
    others are busy elsewhere, the barrier never completes, and MPI_Abort takes the job down so that
    nobody waits for a peer that is gone.
    """
    global _failing
    _failing = True  # the peers learn it from the abort or from their own failure, not a notice
    MPI = _mpi()
    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        request = MPI.COMM_WORLD.Ibarrier()
        deadline = time.monotonic() + GRACE_SECONDS
        while not request.Test():
            if time.monotonic() > deadline:
                sys.stderr.flush()
                MPI.COMM_WORLD.Abort(code)
            time.sleep(0.01)
    sys.stdout.flush()
    sys.exit(code)


_failing = False
_communicators = 0  # MPICommunicators created in this process (each then tells its own peers)
_world_hook = False


def tell_world_at_exit() -> None:
    """Make this process, if it ends before creating an MPICommunicator (`sys.exit` in code that
    runs first, such as a dataset module the config names), tell every other rank of COMM_WORLD,
    which waits for it in the communicator's set-up. Called by the training CLI once MPI is up."""
    global _world_hook
    if not _world_hook:
        _world_hook = True
        atexit.register(_tell_world_exit)


def _tell_world_exit() -> None:
    import numpy as np

    MPI = _mpi()
    if _communicators or _failing or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    notice = np.array([_EXITED, rank, 0.0], dtype=np.float64)
    requests = [
        world.Isend([notice, MPI.BYTE], dest=k, tag=_WORLD_EXIT_TAG)
        for k in range(size)
        if k != rank
    ]
    deadline = time.monotonic() + 1.0  # small messages leave at once; never hold up the exit
    while not MPI.Request.Testall(requests) and time.monotonic() < deadline:
        time.sleep(1e-3)


def _report_uncaught(exc_type, exc, tb) -> None:
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
        sys.__excepthook__(exc_type, exc, tb)
        return
    MPI = _mpi()
    rank = MPI.COMM_WORLD.Get_rank()
    traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
    write_stderr_line(f"error (rank {rank}): {one_line(exc)}")
    try:
        exit_or_abort(1)
    except SystemExit:
        pass  # the interpreter is already on its way out with a non-zero status


def abort_on_uncaught_exception() -> None:
    """Make an uncaught exception on any rank end the whole MPI job (see `exit_or_abort`).

    Installed as `sys.excepthook` by the first `MPICommunicator`; an excepthook the user set
    themselves is left alone.
    """
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _report_uncaught


def count_communicator() -> None:
    """An MPICommunicator was created: from now on it tells its own peers when this rank exits."""
    global _communicators
    _communicators += 1


def failing() -> bool:
    """True once this rank is on its way out through `exit_or_abort`."""
    return _failing


def _mpi():
    """mpi4py's MPI module; the first call initialises MPI with the GIL released (see `_init`)."""
    try:
        import mpi4py
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "MPICommunicator needs mpi4py: pip install 'gossip_powersgd[mpi]' (or build mpi4py "
            "against your system MPI: env MPICC=mpicc pip install --no-binary=mpi4py mpi4py)"
        ) from exc
    if "mpi4py.MPI" not in sys.modules and mpi4py.rc.initialize is True:
        _init(mpi4py)
    from mpi4py import MPI

    return MPI


def _init(mpi4py) -> None:
    """Initialise MPI as mpi4py would, but with the GIL released: MPI_Init waits for every rank,
    and mpi4py's own call holds the GIL all along, so the liveness monitor (started first) could
    not name a rank stopped before it reached MPI_Init. ctypes releases the GIL around the call."""
    import ctypes

    faults.start()
    mpi4py.rc.initialize, mpi4py.rc.finalize = False, True
    from mpi4py import MPI

    libraries = sorted({line.split()[-1] for line in _maps() if "/libmpi" in line})
    try:
        library = ctypes.CDLL(libraries[0], mode=ctypes.RTLD_GLOBAL)
        provided = ctypes.c_int()
        library.MPI_Init_thread(None, None, MPI.THREAD_MULTIPLE, ctypes.byref(provided))
    except (IndexError, OSError, AttributeError):  # not found: mpi4py's own, GIL held
        pass
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):  # what mpi4py's rc.errors="exception" does
        comm.Set_errhandler(MPI.ERRORS_RETURN)


def _maps() -> List[str]:
    try:
        with open("/proc/self/maps") as f:
            return f.read().splitlines()
    except OSError:
        return []
