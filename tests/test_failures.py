"""Failures of the transports and of the process: concurrent use, uncaught errors under MPI, Ctrl-C."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import topologies
from conftest import ROOT, TESTS, run_mpi
from gossip_powersgd import CommunicationError, LocalCluster


def test_a_second_exchange_in_flight_on_one_communicator_is_an_error():
    """Peer 0 starts an exchange from a thread; peer 1 holds back its message until peer 0's main
    thread has tried a second exchange on the same communicator, which must raise at once."""
    second_tried = threading.Event()

    def peer(comm):
        send = {j: torch.full((4,), float(comm.rank)) for j in comm.neighbors}
        recv = {j: torch.empty(4) for j in comm.neighbors}
        if comm.rank == 1:
            assert second_tried.wait(timeout=30)
            comm.exchange(send, recv)
            return None
        worker = threading.Thread(target=comm.exchange, args=(send, recv))
        worker.start()
        while not comm._busy.locked():  # noqa: SLF001 - wait until the first exchange is in flight
            time.sleep(0.001)
        try:
            comm.exchange(send, {j: torch.empty(4) for j in comm.neighbors})
        except CommunicationError as exc:
            error = str(exc)
        else:
            error = None
        second_tried.set()
        worker.join(timeout=30)
        return error, float(recv[1][0])

    results = LocalCluster(topologies.ring(2), timeout=30).run(peer)
    error, received = results[0]
    assert error is not None and "already in the middle of an exchange" in error
    assert received == 1.0  # the first exchange still completed with the right message


def test_local_cluster_accepts_a_spec_and_names_what_it_needs():
    assert LocalCluster("ring:3").run(lambda comm: comm.neighbors) == [(1, 2), (0, 2), (0, 1)]
    with pytest.raises(TypeError, match="needs a topologies.Topology.*or a spec string"):
        LocalCluster(4)


def test_uncaught_exception_on_one_rank_ends_the_mpi_job_promptly():
    started = time.monotonic()
    result = run_mpi(4, [TESTS / "scripts" / "readme_snippet_failure.py"], timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "error (rank 2): rank 2 found something wrong with its data" in result.stderr
    # The survivors would otherwise wait out their 120 s comm timeout. mpiexec's own start-up and
    # four torch imports on two shared cores take most of the remaining allowance.
    assert elapsed < 60
    assert "no message from neighbour" not in result.stderr


def test_ctrl_c_on_the_local_backend_stops_every_peer_and_exits_130():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, str(TESTS / "scripts" / "interrupt_local.py")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=ROOT, start_new_session=True)
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


# ---- config files: duplicate keys, alias bombs, huge input ------------------------------------------

def test_duplicate_yaml_keys_are_an_error_not_last_one_wins(tmp_path):
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "dup.yaml"
    path.write_text("lr: 0.1\nepochs: 2\nlr: 0.5\n")
    with pytest.raises(ValueError, match=r"duplicate key 'lr' \(lines 1 and 3\)"):
        load_config(path)


def test_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    from gossip_powersgd.training.config import load_config

    levels = "abcdefghi"
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip(levels, levels[1:])]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    with pytest.raises(ValueError, match="alias bomb"):
        load_config(path)
    assert time.monotonic() - started < 10  # refused from the node graph, never expanded


def test_a_file_far_larger_than_a_config_is_refused(tmp_path):
    from gossip_powersgd.training.config import load_config
    from gossip_powersgd.training.yaml_loader import MAX_CONFIG_BYTES

    path = tmp_path / "huge.yaml"
    path.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ValueError, match="far more than a config holds"):
        load_config(path)


def test_yaml_anchors_within_limits_still_work(tmp_path):
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "ok.yaml"
    path.write_text("schedule: step\nmilestones: &m [3, 6]\nepochs: 8\n")
    assert load_config(path, deep=False).milestones == [3, 6]
