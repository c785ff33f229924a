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


def _ending(monkeypatch, monitor) -> list:
    """What `main_guard` does at the end, with `monitor` as the current one: the exit functions
    and os._exit are recorded (os._exit is replaced, so sys.exit follows it)."""
    import atexit

    from gossip_powersgd import faults

    ended = []
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: ended.append("exit functions"))
    monkeypatch.setattr(os, "_exit", lambda code: ended.append(code))
    monkeypatch.setattr(faults, "current", lambda: monitor)
    return ended


def test_a_survivor_of_a_lost_peer_ends_without_finalizing_after_its_exit_functions(monkeypatch):
    """`main_guard` ends a run that went on without a lost peer (on_peer_loss: continue) by
    os._exit with its status once the exit functions have run: a thread still in torch's C++
    code as the interpreter finalizes aborts the process ("terminate called"). Any other run
    exits as usual (SystemExit)."""
    import types

    import pytest

    from gossip_powersgd import launch

    monitor = types.SimpleNamespace(policy="continue", removed=set())
    ended = _ending(monkeypatch, monitor)
    with pytest.raises(SystemExit):  # nobody lost: the usual exit
        launch.main_guard(lambda: 0)
    assert ended == []
    monitor.removed.add(2)
    with pytest.raises(SystemExit):
        launch.main_guard(lambda: 3)
    assert ended == ["exit functions", 3]


def test_a_rejoined_process_ends_without_finalizing_though_it_lost_nobody(monkeypatch):
    """A `--rejoin` process that saw no loss after its admission (the second of two rejoins)
    also ends by os._exit after its exit functions: its members' groups are torch's too, and a
    CI run saw it abort at exit ("terminate called without an active exception")."""
    import types

    import pytest

    from gossip_powersgd import launch
    from gossip_powersgd.comm import torch_rejoin

    ended = _ending(monkeypatch, types.SimpleNamespace(policy="continue", removed=set()))
    monkeypatch.setattr(torch_rejoin, "_rejoining", 1)
    with pytest.raises(SystemExit):
        launch.main_guard(lambda: 0)
    assert ended == ["exit functions", 0]
