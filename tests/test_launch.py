"""The process around a run (launch.py's main_guard): an uncaught error on one rank ends the mpiexec
job promptly; Ctrl-C on the local backend stops every peer with one line and exit status 130."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, SUPPORT, run_mpi


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


def test_ctrl_c_on_the_local_backend_stops_every_peer_and_exits_130():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [sys.executable, str(SUPPORT / "scripts" / "interrupt_local.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted" in lines[0], stderr
    assert "terminate called" not in stderr
