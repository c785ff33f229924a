"""The torch.distributed transport (gloo, 4 processes): torch == MPI == local bit for bit, bad inputs.

Every launch has a hard timeout, so a hang fails the test instead of stalling the suite.
"""

import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

import shared_launches
from tests.comm.test_torch_launch import LAUNCHER_VARIABLES
from tests.conftest import ROOT, SUPPORT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{SUPPORT}"})
    for var in LAUNCHER_VARIABLES:  # a clean child: no launcher of this process leaks in
        env.pop(var, None)
    env.update(extra or {})
    return env


def _communicate(process, timeout, what):
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(
            f"{what} did not finish within {timeout} s (a hang):\n{out[-2000:]}\n{err[-2000:]}"
        )


def run_torchrun(n, args, timeout=180):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(n),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        *map(str, args),
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
        start_new_session=True,
    )
    out, err = _communicate(process, timeout, " ".join(command))
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def run_ranks(n, case, timeout=90, silent=None):
    """Start n worker processes with the launcher's variables set by hand; return (codes, stderr).
    `silent`: a rank that only sleeps, never sending, for longer than the others take: SIGKILLed
    once every other rank has ended (what it would do then is end), not waited for."""
    port = str(free_port())
    processes = [
        subprocess.Popen(
            [sys.executable, str(SUPPORT / "torch_worker.py"), "--case", case],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            start_new_session=True,
            env=_env(
                {
                    "RANK": str(k),
                    "WORLD_SIZE": str(n),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                }
            ),
        )
        for k in range(n)
    ]
    results = {}
    for k in sorted(range(n), key=lambda k: k == silent):  # the silent rank last
        if k == silent:
            processes[k].kill()
        results[k] = _communicate(processes[k], timeout, f"torch_worker {case} rank {k}")
    return [p.returncode for p in processes], "".join(results[k][1] for k in range(n))


def assert_bit_equal(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_bit_equal(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_bit_equal(x, y, f"{where}[{k}]")
    else:
        assert a == b, where


@pytest.mark.mpi
@pytest.mark.torchrun
def test_torch_equals_mpi_equals_local_bit_for_bit(tmp_path_factory):
    """Every ring:4 scenario of tests/support/shared_launches.py (every algorithm, the awkward
    all-reduces, exact gossip, PowerGossip with a restart), one launch per transport:
    torch.distributed and MPI give the in-process cluster's bits on every rank."""
    over_torch = shared_launches.ring4("torch", tmp_path_factory)
    over_mpi = shared_launches.ring4("mpi", tmp_path_factory)
    local = shared_launches.ring4_local()
    for rank in range(4):
        assert_bit_equal(over_torch[rank], local[rank], f"torch vs local, rank {rank}")
        assert_bit_equal(over_mpi[rank], local[rank], f"mpi vs local, rank {rank}")


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "world_size",
            "torch.distributed world size 3 does not match the topology's 8 peers: "
            "run torchrun --nproc-per-node 8",
        ),
        (
            "topologies_differ",
            "topology differs across ranks: ranks 0-1 hold variant 1; ranks 2 hold variant 2",
        ),
        (
            "shapes_differ",
            "parameter shapes and dtypes differs across ranks: ranks 0-1 hold variant 1; "
            "ranks 2 hold variant 2",
        ),
        ("device_differs", "device type differs across ranks: ranks 0-1 use cpu; ranks 2 use meta"),
    ],
)
def test_bad_inputs_fail_on_every_rank(case, message):
    # 3 ranks: two agree and one differs (the checks group the ranks into variants)
    codes, stderr = run_ranks(3, case)
    assert all(code != 0 for code in codes), stderr[-2000:]
    for rank in range(3):
        assert f"error (rank {rank}): {message}" in stderr, stderr[-2000:]
    assert "Traceback" not in stderr


def test_a_timeout_too_short_to_join_is_one_line_naming_the_rank():
    codes, stderr = run_ranks(2, "tiny_timeout")
    assert all(code != 0 for code in codes), stderr[-2000:]
    for rank in range(2):
        assert (
            f"error (rank {rank}): rank {rank}: could not join the process group at 127.0.0.1:"
            in stderr
        ), stderr[-2000:]
    assert "within 1e-06 s" in stderr and "Traceback" not in stderr


def _worker(rank, size, port, case="join_ring"):
    """One worker process, rank `rank` of `size`, on a port the test holds."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1"}
    return subprocess.Popen(
        [sys.executable, str(SUPPORT / "torch_worker.py"), "--case", case],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
        env=_env({**env, "MASTER_PORT": str(port)}),
    )


def test_a_port_in_use_asks_for_a_free_port_not_a_longer_timeout():
    """Rank 0 cannot listen on a port another process holds: before, the line said to raise the
    timeout, which never helps; now it names the port and MASTER_PORT."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        process = _worker(0, 1, port)
        out, err = _communicate(process, 60, "join_ring")
    assert process.returncode != 0
    assert (
        f"error (rank 0): rank 0: port 127.0.0.1:{port} is already in use (another job on this "
        "host, or a process still holding it): give this job a free port, MASTER_PORT=" in err
    ), err[-2000:]
    assert "raise the timeout" not in err and "Traceback" not in err


def test_a_rank_of_a_second_job_on_the_same_port_is_refused_and_leaves_the_first_alone():
    """A second job's rank 1 whose rank 0 could not listen (the first job holds the port) reaches
    the first job's store: before, it overwrote the first job's rank-1 keys, passed the set-up
    checks against them and talked to its peers. Now its place is taken: one line naming the clash
    and MASTER_PORT, and the first job's keys as they were."""
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    first = dist.PrefixStore("gossip_powersgd/1/", store)
    first.add("claim/1", 1)  # the first job's rank 1 is in
    first.set("hello/1", "first job")
    process = _worker(1, 2, port)
    out, err = _communicate(process, 60, "join_ring")
    assert process.returncode != 0
    assert (
        f"error (rank 1): rank 1: another process already joined as rank 1 at 127.0.0.1:{port} "
        "(two jobs on one port?): give each job its own free port, MASTER_PORT=" in err
    ), err[-2000:]
    assert first.get("hello/1") == b"first job" and not first.check(["failed"])
    assert first.add("claim/0", 0) == 0  # it claimed nothing else


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nccl_without_cuda_fails_on_every_rank():
    codes, stderr = run_ranks(3, "nccl_without_cuda")
    assert all(code != 0 for code in codes)
    for rank in range(3):
        assert (
            f"error (rank {rank}): backend nccl needs CUDA, which this machine does not have: "
            "use backend gloo on device cpu"
        ) in stderr, stderr[-2000:]


def test_wrong_message_size_names_the_peer():
    codes, stderr = run_ranks(3, "message_size")  # ring:3: peer 1 sends to 0 and 2
    assert any(code != 0 for code in codes)
    assert "message from peer 1 has 28 bytes, expected 20" in stderr, stderr[-2000:]


@pytest.mark.timing
def test_silent_peer_is_named_by_its_neighbours():
    codes, stderr = run_ranks(4, "silent_peer", silent=2)
    assert codes[0] != 0 and codes[1] != 0 and codes[3] != 0
    # rank 1 names only the neighbour whose message did not come (before: [0, 2])
    assert "rank 1: no message from neighbour(s) [2] within 3 s" in stderr, stderr[-2000:]
    # rank 0 waits for 1 and 3, themselves waiting for 2. When its own timeout comes first it names
    # 2 (before: [1, 3] alone); when 1 and 3 have already ended after theirs, gloo tells it that
    # the connections to them broke, which is what happened to it then.
    chain = (
        "rank 0: no message from neighbour(s) [1, 3] within 3 s: they wait for peer(s) [2] "
        "themselves, which sent nothing (is it alive?)"
    )
    broken = "error (rank 0): rank 0: talking to neighbour(s) [1, 3] failed"
    assert chain in stderr or broken in stderr, stderr[-2000:]


def test_no_launcher_environment_is_one_line():
    process = subprocess.run(
        [sys.executable, str(SUPPORT / "torch_worker.py"), "--case", "world_size"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert process.returncode != 0
    assert process.stderr.strip() == (
        "error (rank ?): backend torch needs a launcher: torchrun "
        "--nproc-per-node N python -m ... or mpiexec -n N python -m ... "
        "(N = the topology's size); RANK and WORLD_SIZE are not set"
    )


@pytest.mark.torchrun
def test_training_under_torchrun_equals_the_local_backend(tmp_path):
    """`backend: torch` through the training CLI: the same models, bit for bit, as in one process
    (tiny.yaml's ring:4 given as a sizeless ring, which torchrun's world size completes)."""
    import json

    from experiments.train import run

    tiny = ROOT / "experiments" / "configs" / "tiny.yaml"
    local = run(
        [
            "--config",
            str(tiny),
            "--quiet",
            "--set",
            f"out_dir={tmp_path / 'local'}",
            "--set",
            "epochs=1",
        ]
    )
    # a sizeless "ring" takes torchrun's world size, as under mpiexec (it was refused as a spec "the
    # local backend cannot guess")
    result = run_torchrun(
        4,
        [
            "-m",
            "experiments.train",
            "--config",
            tiny,
            "--quiet",
            "--set",
            "backend=torch",
            "--set",
            "topology=ring",
            "--set",
            f"out_dir={tmp_path / 'torch'}",
            "--set",
            "epochs=1",
        ],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "torch" / "summary.json").read_text())
    assert summary["model_sha256"] == local["model_sha256"]
    assert summary["mb_sent_per_peer"] == local["mb_sent_per_peer"]


def tiny_torch_process(tmp_path, env) -> subprocess.CompletedProcess:
    """experiments/train.py on tiny.yaml with backend torch, one process started by hand (no
    launcher, or launcher variables set in `env`); 120 s: one interpreter importing torch."""
    config = ROOT / "experiments" / "configs" / "tiny.yaml"
    args = [sys.executable, "-m", "experiments.train", "--config", str(config)]
    args += ["--set", "backend=torch", "--set", f"out_dir={tmp_path / 'run'}"]
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_backend_torch_without_a_launcher_is_one_line(tmp_path):
    result = tiny_torch_process(tmp_path, _env())
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: backend torch runs one peer per process: launch with torchrun "
        "--nproc-per-node 4 -m experiments.train ..., or use --set backend=local"
    ]
    assert not (tmp_path / "run").exists()


def test_a_negative_rank_is_one_line_not_a_liveness_traceback(tmp_path):
    """RANK=-1 (a launcher set by hand): before, the liveness monitor started at import crashed
    its thread with a struct.error traceback; now the transport's line is all there is."""
    env = _env({"RANK": "-1", "WORLD_SIZE": "4", "MASTER_PORT": str(free_port())})
    result = tiny_torch_process(tmp_path, env)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "error (rank -1): RANK=-1 and WORLD_SIZE=4 do not fit: WORLD_SIZE must be >= 1 and RANK "
        "from 0 to WORLD_SIZE-1 (start one process per rank, as torchrun or mpiexec do)"
    ], result.stderr[-2000:]


@pytest.mark.torchrun
def test_backend_local_under_torchrun_is_one_line_not_a_lock_error(tmp_path):
    """One line from each rank: torchrun ends every worker once one has exited, so the first to
    fail waits for the others in torchrun's store (`comm.torch_launch.agent_store`; before, rank 1
    was sometimes ended by torchrun before it printed, on a loaded machine)."""
    result = run_torchrun(
        2,
        [
            "-m",
            "experiments.train",
            "--config",
            ROOT / "experiments" / "configs" / "tiny.yaml",
            "--set",
            "backend=local",
            "--set",
            f"out_dir={tmp_path / 'run'}",
        ],
        timeout=120,
    )
    assert result.returncode != 0
    expected = (
        "backend local runs every peer as a thread of one process, but torchrun "
        "started 2 processes (WORLD_SIZE=2): use --set backend=torch, or run without torchrun"
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    # one line per process, each naming its rank
    assert sorted(lines) == [f"error (rank {k}): {expected}" for k in (0, 1)], result.stderr[-2000:]
    assert not (tmp_path / "run").exists()
