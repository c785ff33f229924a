"""The process around a run (launch.py's main_guard): Ctrl-C on the local backend stops every peer
with one line and exit status 130 (an uncaught error on one rank under mpiexec:
tests/comm/test_mpi_world.py)."""

import os
import signal
import subprocess
import sys

from tests.conftest import ROOT, SUPPORT


def _as_from_a_terminal() -> None:
    """In the child, before it starts: SIGINT's default action, as in a shell's foreground job.
    A job started in the background of a non-interactive shell (`make test &`, nohup ... &)
    ignores SIGINT, and Python then installs no KeyboardInterrupt handler: the child would
    ignore the test's Ctrl-C (as it should) and the test wait 60 s for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        preexec_fn=_as_from_a_terminal,
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
