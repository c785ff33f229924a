"""Failures of the transports and of the process: concurrent use, uncaught errors under MPI, Ctrl-C."""

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import topologies
from tests.conftest import ROOT, SUPPORT, mpiexec_path, run_mpi
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


# ---- a rank stopped, or leaving early, under mpiexec and torchrun ----------------------------------


class FaultJob:
    """tests/support/scripts/fault_peer.py on 4 ranks under `launcher` (mpi: mpiexec, torch: torchrun).

    stdout is read by a thread, so that waiting for the ranks' `ready` lines has a deadline."""

    def __init__(self, launcher: str, timeout: float, action: str = ""):
        from tests.comm.test_torch import _env, free_port

        script = [str(SUPPORT / "scripts" / "fault_peer.py"), launcher, str(timeout)]
        script += [action] if action else []
        if launcher == "mpi":
            command = [mpiexec_path(), "-n", "4", sys.executable, *script]
        else:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "4",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(free_port()),
                *script,
            ]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=ROOT,
            start_new_session=True,
        )
        self.lines = queue.Queue()
        self.stderr = []
        self.readers = [
            threading.Thread(target=self._pump, args=(stream, put), daemon=True)
            for stream, put in (
                (self.process.stdout, self.lines.put),
                (self.process.stderr, self.stderr.append),
            )
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line)

    def ready_pids(self, within: float = 120) -> dict:
        """{rank: pid} once every rank has gossiped a few steps."""
        pids, deadline = {}, time.monotonic() + within
        while len(pids) < 4:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                self.kill()
                pytest.fail(f"the ranks were not ready within {within} s:\n{''.join(self.stderr)}")
            for part in line.split("ready ")[1:]:  # forwarded lines may run together
                rank, pid = part.split()[:2]
                pids[int(rank)] = int(pid)
        return pids

    def wait(self, within: float) -> float:
        """Seconds until the job ended; fails (killing it) if it runs past `within`."""
        started = time.monotonic()
        try:
            self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job was still running {within} s later:\n{''.join(self.stderr)}")
        return time.monotonic() - started

    def errors(self) -> list:
        """The ranks' error lines, once the readers have drained what the ended job wrote."""
        for reader in self.readers:
            reader.join(timeout=10)
        return [line.strip() for line in self.stderr if line.startswith("error (rank")]

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _stopped_ranks_gone(pids) -> bool:
    from tests.training.test_trainer_reliability import alive

    # A killed process takes a moment to be reaped, and it is not our child (no waitpid): poll,
    # bounded by the deadline, and report what is still alive at its end.
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(pid) for pid in pids.values())


@pytest.mark.mpi
@pytest.mark.torchrun
@pytest.mark.parametrize("launcher", ["mpi", "torch"])
def test_a_stopped_rank_is_named_by_every_rank_and_the_job_ends_before_the_timeout(launcher):
    """SIGSTOP rank 2 of ring:4 with a 20 s comm timeout. A stopped peer never answers: its
    neighbours, watching its process state while they wait, name it after half the timeout, and the
    job ends. Before, every rank waited out the timeout and rank 0 blamed its live neighbours 1
    and 3 (themselves waiting for 2); torchrun then waited 30 s more on a SIGTERM that a stopped
    process never acts on."""
    job = FaultJob(launcher, timeout=20)
    pids = job.ready_pids()
    os.kill(pids[2], signal.SIGSTOP)
    try:
        seconds = job.wait(within=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[2], signal.SIGKILL)
    errors = job.errors()
    print(f"{launcher}: job gone {seconds:.1f} s after the SIGSTOP\n" + "\n".join(errors))
    assert job.process.returncode != 0
    # Found after 10 s, gone a few seconds later. Before: 20 s timeout + 5 s grace (mpi), + 30 s
    # of torchrun's SIGTERM wait (torch); the names below are what catches the mpi case.
    assert seconds < 40, errors
    assert len(errors) >= 2 and all("peer 2 has been stopped" in line for line in errors), errors
    assert _stopped_ranks_gone(pids)


@pytest.mark.mpi
@pytest.mark.torchrun
@pytest.mark.parametrize("launcher", ["mpi", "torch"])
def test_a_rank_that_calls_sys_exit_is_named_within_seconds(launcher):
    """Rank 1 calls sys.exit(0) mid-gossip (user code may): its process says it left as it ends,
    and the others name it instead of waiting out the 60 s comm timeout (mpi) or blaming both
    neighbours (torch); the job's exit status is not 0."""
    job = FaultJob(launcher, timeout=60, action="exit:1:0")
    job.ready_pids()
    seconds = job.wait(within=120)
    errors = job.errors()
    print(f"{launcher}: job gone {seconds:.1f} s after the ranks were ready\n" + "\n".join(errors))
    assert job.process.returncode != 0
    assert seconds < 60, errors
    assert len(errors) >= 2, errors
    assert all(
        "peer 1 ended its process (sys.exit, or the end of its script)" in line for line in errors
    ), errors


@pytest.mark.mpi
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


@pytest.mark.mpi
def test_user_code_that_exits_during_the_config_check_ends_the_mpi_job_naming_it(tmp_path):
    """A dataset function that calls sys.exit(0) on rank 1 while the config is validated (before
    any communicator) is an error of that rank naming the spec (`specs.user_code`), and the job
    ends within seconds, not after comm_timeout."""
    started = time.monotonic()
    result = run_mpi(
        4,
        [
            "-m",
            "experiments.train",
            "--config",
            ROOT / "experiments" / "configs" / "tiny.yaml",
            "--set",
            "backend=mpi",
            "--set",
            "dataset=fault_fixtures:exit_on_rank_1",
            "--set",
            f"out_dir={tmp_path / 'run'}",
            "--quiet",
        ],
        timeout=100,
    )
    seconds = time.monotonic() - started
    errors = [line for line in result.stderr.splitlines() if line.startswith("error (rank")]
    assert result.returncode != 0 and seconds < 60, errors
    assert any(
        line.startswith("error (rank 1): ")
        and "'fault_fixtures:exit_on_rank_1': the user code called sys.exit/exit(0)" in line
        for line in errors
    ), errors


@pytest.mark.torchrun
def test_ctrl_c_on_torchrun_stops_every_rank_each_naming_itself():
    """torchrun passes Ctrl-C (SIGINT) on to every worker: each says it was interrupted, naming its
    rank (before, four identical lines without one). torchrun's own status is 1, from its own
    SignalException: a launcher's status, which its workers cannot set."""
    job = FaultJob("torch", timeout=60)
    job.ready_pids()
    job.process.send_signal(signal.SIGINT)
    job.wait(within=60)
    for reader in job.readers:
        reader.join(timeout=10)
    # The workers and torchrun share one stderr pipe: a line of one may land in the middle of
    # another's (torchrun's warnings are not written in one piece), so search the whole text.
    named = re.findall(r"rank (\d+): interrupted \(Ctrl-C\)", "".join(job.stderr))
    assert sorted(map(int, named)) == list(range(4)), job.stderr
    assert job.process.returncode != 0


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
