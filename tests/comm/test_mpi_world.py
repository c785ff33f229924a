"""comm/mpi_world.py: the MPI process around the transport: a rank that ends early, before its
communicator exists or by an uncaught exception, is known to the others, and the job ends promptly
(under mpiexec); the exception hook is installed only where the user set none."""

import sys
import time

import pytest

from gossip_powersgd.comm import mpi_world
from tests.conftest import SUPPORT, run_mpi


def test_the_abort_hook_is_installed_only_over_pythons_own(monkeypatch):
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    mpi_world.abort_on_uncaught_exception()
    assert sys.excepthook is mpi_world._report_uncaught

    def users(*args):
        pass

    monkeypatch.setattr(sys, "excepthook", users)
    mpi_world.abort_on_uncaught_exception()
    assert sys.excepthook is users  # the user's own hook is left alone


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_or_exit_goes_to_pythons_own_hook_without_mpi(monkeypatch, kind):
    """Ctrl-C and sys.exit are no error of the rank: Python's own hook reports them, and MPI is
    not touched (no abort of the job, no initialisation here)."""
    seen = []
    monkeypatch.setattr(sys, "__excepthook__", lambda *args: seen.append(args[0]))
    monkeypatch.setattr(mpi_world, "_mpi", lambda: pytest.fail("MPI touched"))
    mpi_world._report_uncaught(kind, kind(), None)
    assert seen == [kind]


#: Not `timing` (run beside the other tests): the job took 7.5 s in CI's timing part; the bound,
#: 60 s from the launch, only sets that apart from the 120 s comm timeout waited out, which the
#: other worker's load on the launch cannot blur.
@pytest.mark.mpi
def test_uncaught_exception_on_one_rank_ends_the_mpi_job_promptly():
    started = time.monotonic()
    result = run_mpi(4, [SUPPORT / "scripts" / "readme_snippet_failure.py"], timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "error (rank 2): rank 2 found something wrong with its data" in result.stderr
    # The survivors would otherwise wait out their 120 s comm timeout. mpiexec's own start-up and
    # four torch imports on two shared cores take most of the remaining allowance.
    assert elapsed < 60
    assert "no message from neighbour" not in result.stderr


@pytest.mark.mpi  # not `timing`: ~7 s against a 60 s bound that only sets the 120 s timeout apart
def test_a_rank_that_exits_before_its_communicator_exists_is_named():
    """Under mpiexec, rank 1 ends its process (sys.exit(0)) before it creates a communicator: the
    others, in the communicator's collective set-up, read the notice it sent on COMM_WORLD as it
    ended. Before, they hung there for ever (a blocking MPI_Comm_dup)."""
    started = time.monotonic()
    result = run_mpi(4, [SUPPORT / "scripts" / "exit_before_comm.py", "120"], timeout=100)
    seconds = time.monotonic() - started
    errors = [line for line in result.stderr.splitlines() if line.startswith("error (rank")]
    assert result.returncode != 0
    assert seconds < 60, errors  # comm_timeout is 120 s
    assert len(errors) == 3 and all("peer 1 ended its process" in line for line in errors), errors
