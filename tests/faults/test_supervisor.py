"""faults/supervisor.py: the parent that names its rank when that rank is killed under mpiexec, and
which programs it supervises."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from gossip_powersgd.faults import liveness, supervisor
from liveness_jobs import LONG_RUN, Job, last_gone, train_command
from tests.conftest import SUPPORT


@pytest.mark.parametrize(
    "argv, program",
    [
        (["python", "-mgossip_powersgd.cli.train", "--quiet"], "gossip_powersgd.cli.train"),
        (["python", "-W", "error", "-u", "train.py"], "train.py"),
        (["python", "-m"], None),
        (["python"], None),
    ],
)
def test_the_joined_and_separated_spellings_of_the_command_line(monkeypatch, argv, program):
    monkeypatch.setattr(sys, "orig_argv", argv, raising=False)
    assert supervisor.main_program() == program


def test_an_mpi_rank_is_told_by_mpich_or_open_mpis_rank_variable(monkeypatch):
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not supervisor.under_mpi_launcher()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert supervisor.under_mpi_launcher()


def test_the_supervised_programs_are_told_from_their_command_line(monkeypatch):
    from gossip_powersgd.faults import supervisor

    for argv, program in (
        (
            ["python", "-u", "-m", "gossip_powersgd.cli.train", "--config", "x"],
            "gossip_powersgd.cli.train",
        ),
        (["python", "-X", "dev", "-m", "experiments.train"], "experiments.train"),
        (["/venv/bin/python", "/venv/bin/gossip-train", "--config", "x"], "gossip-train"),
        (["python", "-c", "import gossip_powersgd"], None),
        (["python", "my_script.py"], "my_script.py"),
    ):
        monkeypatch.setattr(sys, "orig_argv", argv, raising=False)
        assert supervisor.main_program() == program, argv
    assert "my_script.py" not in supervisor.PROGRAMS  # a user's own script is left as it is


def _supervised(*args):
    env = dict(os.environ, PMI_RANK="3", PMI_SIZE="4", PYTHONPATH=str(SUPPORT.parents[1]))
    env.pop("GOSSIP_POWERSGD_SUPERVISOR", None)
    return subprocess.Popen(
        [sys.executable, str(SUPPORT / "scripts" / "supervised.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_supervisor_passes_exit_statuses_and_signals_through_and_names_a_killed_rank():
    """Its child's exit status is its own; a signal it is sent reaches the child, and the child's
    end by that signal is its own too, without a word; a child killed by anyone else is named (rank,
    pid, supervisor pid, host, signal) and the supervisor ends by the same signal."""
    done = _supervised("exit", "7")
    _, err = done.communicate(timeout=60)
    assert done.returncode == 7 and err == ""

    killed = _supervised("kill")
    _, err = killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error (rank 3): this rank's process (pid ")
    assert (
        f"under supervisor pid {killed.pid}, host {socket.gethostname()}) was killed by "
        in (lines[0])
    )
    assert "signal 9 SIGKILL (kill -9, or the OOM killer" in lines[0]

    waiting = _supervised("wait")
    child = int(waiting.stdout.readline().split()[1])
    assert liveness.parent_of(child) == waiting.pid
    waiting.send_signal(signal.SIGTERM)  # what a launcher sends
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == -signal.SIGTERM and err == ""


@pytest.mark.mpi
def test_a_rank_killed_under_mpiexec_is_named_with_its_host_and_signal(tmp_path):
    """SIGKILL rank 2's process mid-run. MPICH ends every rank within a fraction of a second and its
    banner names a PID, often another rank's; now rank 2's supervisor (its parent, which alone
    learns for certain how it ended) names the rank, the pid killed, the host and the signal.
    Before, the project printed nothing."""
    n = 4
    job = Job(train_command("mpi", n, tmp_path / "run", LONG_RUN))
    pids = {}
    try:
        job.wait_line(r"^epoch 1/", 300)
        pids = job.rank_pids(n)
        supervisor = liveness.parent_of(pids[2])
        os.kill(pids[2], signal.SIGKILL)
        killed = time.monotonic()
        seconds = last_gone(list(pids.values()), killed, 60)
        job.wait(30)
    finally:
        job.kill()
    errors = job.errors()
    named = job.first_error_after(killed)
    print(
        f"mpi killed: named after {named} s, every rank gone after {seconds} s\n"
        + "\n".join(errors)
    )
    assert seconds is not None and job.process.returncode != 0
    line = (
        f"error (rank 2): this rank's process (pid {pids[2]}, under supervisor pid {supervisor}, "
        f"host {socket.gethostname()}) was killed by signal 9 SIGKILL"
    )
    assert any(e.startswith(line) for e in errors), errors


@pytest.mark.mpi
def test_ctrl_c_reaches_every_supervised_rank(tmp_path):
    """Under mpiexec, the SIGINT hydra passes on (mpiexec's Ctrl-C) reaches every rank through its
    supervisor: each says it was interrupted, none is reported killed; the supervisors never
    import torch."""
    n = 2
    job = Job(train_command("mpi", n, tmp_path / "run", LONG_RUN))
    try:
        job.wait_line(r"^epoch 1/", 300)
        pids = job.rank_pids(n)
        supervisors = [liveness.parent_of(p) for p in pids.values()]
        for pid in supervisors:
            with open(f"/proc/{pid}/maps") as f:
                assert "libtorch" not in f.read()
        for pid in supervisors:
            os.kill(pid, signal.SIGINT)
        assert job.wait(60) is not None
    finally:
        job.kill()
    text = job.text()
    assert job.process.returncode != 0, text
    # The first rank to exit (130) makes MPICH kill the other at once: it may not get to speak.
    assert "rank 0: interrupted (Ctrl-C)" in text or "rank 1: interrupted (Ctrl-C)" in text, text
    assert "was killed by signal" not in text, text
