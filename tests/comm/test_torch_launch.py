"""comm/torch_launch.py: a peer's rank and world size from torchrun's variables or mpiexec's mapped
onto them, its device and backend, and a one-line error for each environment that cannot work.
(The same errors through a launched program: tests/comm/test_torch.py.)"""

from __future__ import annotations

import os
import re

import pytest
import torch

from gossip_powersgd.comm.torch_launch import launcher_environment, resolve_device

LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
)


@pytest.fixture
def environment(monkeypatch):
    """No launcher's variable set; the whole environment restored after the test.
    `launcher_environment` writes os.environ itself (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT), which monkeypatch does not see: left there, a later test in the same process
    (a pytest-xdist worker, or the serial suite) would take itself for a torchrun rank."""
    saved = dict(os.environ)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


def test_torchruns_variables_are_read_and_the_rendezvous_defaults_filled_in(environment):
    environment.setenv("RANK", "2")
    environment.setenv("WORLD_SIZE", "4")
    environment.setenv("MASTER_PORT", "31000")
    assert launcher_environment() == (2, 4)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("127.0.0.1", "31000")


@pytest.mark.parametrize(
    "rank, size, local",
    [
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH's Hydra
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
    ],
)
def test_mpiexecs_variables_are_mapped_onto_torchruns(environment, rank, size, local):
    environment.setenv(rank, "3")
    environment.setenv(size, "8")
    environment.setenv(local, "1")
    assert launcher_environment() == (3, 8)
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "3",
        "8",
        "1",
    )
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("127.0.0.1", "29500")


def test_no_launcher_and_a_rank_that_is_no_integer_are_one_line_errors(environment):
    with pytest.raises(ValueError, match="backend torch needs a launcher: torchrun") as info:
        launcher_environment()
    assert "\n" not in str(info.value)
    environment.setenv("RANK", "zero")
    environment.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="RANK='zero' and WORLD_SIZE='4' must be integers"):
        launcher_environment()


@pytest.mark.parametrize(
    "rank, size, port, message",
    [
        ("-1", "2", "29500", "RANK=-1 and WORLD_SIZE=2 do not fit"),
        ("4", "4", "29500", "RANK=4 and WORLD_SIZE=4 do not fit"),
        ("0", "0", "29500", "RANK=0 and WORLD_SIZE=0 do not fit"),
        ("0", "2", "abc", "MASTER_PORT='abc' is not a port number"),
        ("0", "2", "70000", "MASTER_PORT='70000' is not a port number"),
    ],
)
def test_a_rank_outside_the_world_or_a_bad_port_is_one_line_before_any_rendezvous(
    environment, rank, size, port, message
):
    """Before, RANK=-1 crashed the liveness thread (a struct.error traceback) and RANK=4 of 4 or
    WORLD_SIZE=0 waited out the whole timeout, then blamed another rank or the timeout."""
    environment.setenv("RANK", rank)
    environment.setenv("WORLD_SIZE", size)
    environment.setenv("MASTER_PORT", port)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        launcher_environment()
    assert "\n" not in str(info.value)


def test_a_rank_outside_the_world_starts_no_liveness_monitor():
    """The monitor packs its rank into every heartbeat: RANK=-1 crashed its thread with a
    traceback (at import, in the training programs) before any one-line error could be said."""
    from gossip_powersgd.faults.liveness import launched_rank

    assert launched_rank({"RANK": "1", "WORLD_SIZE": "2"}) == (1, 2)
    for rank, size in (("-1", "2"), ("2", "2"), ("0", "0")):
        assert launched_rank({"RANK": rank, "WORLD_SIZE": size}) is None


def test_the_cpu_takes_gloo_and_a_pair_that_cannot_work_is_refused_in_one_line():
    assert resolve_device(None, None) == (torch.device("cpu"), "gloo")
    assert resolve_device("cpu", "gloo") == (torch.device("cpu"), "gloo")
    for device, backend, message in [
        ("cpu", "mpi", "unknown torch.distributed backend 'mpi'; valid: gloo, nccl"),
        ("meta", "gloo", "device meta is not supported: use cpu (gloo) or cuda (nccl)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            resolve_device(device, backend)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for a machine without CUDA")
def test_nccl_or_cuda_without_cuda_names_the_cpu_way():
    for device, backend, first in [
        ("cpu", "nccl", "backend nccl"),
        ("cuda", "gloo", "device cuda"),
    ]:
        with pytest.raises(ValueError) as info:
            resolve_device(device, backend)
        assert str(info.value) == (
            f"{first} needs CUDA, which this machine does not have: use backend gloo on device cpu"
        )


def test_a_host_with_more_nccl_processes_than_gpus_is_refused_by_each_and_gloo_shares(
    environment,
):
    """`torchrun --nproc-per-node 8` with device auto (the paper's ResNet-20 grid) on a host of 4
    GPUs: LOCAL_RANK 4-7 were sent to cuda:4-7, CUDA's "invalid device ordinal" on those ranks
    only, while ranks 0-3 waited out the rendezvous. Under NCCL every process of such a host now
    refuses it in one line; under gloo the processes share the GPUs."""
    monkeypatch = environment
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    for local in ("0", "4", "7"):
        monkeypatch.setenv("LOCAL_RANK", local)
        with pytest.raises(ValueError) as info:
            resolve_device("cuda", None)
        assert str(info.value) == (
            "this host runs 8 processes but has 4 GPU(s), and NCCL puts one process on each: "
            "start at most 4 per host (torchrun --nproc-per-node 4), or use device cpu (gloo)"
        )
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert resolve_device("cuda", "gloo") == (torch.device("cuda", 1), "gloo")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("cuda", None) == (torch.device("cuda", 3), "nccl")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # an MPI launcher's: LOCAL_RANK alone tells
    monkeypatch.setenv("LOCAL_RANK", "4")
    with pytest.raises(ValueError, match="^this host runs 5 processes but has 4 GPU"):
        resolve_device("cuda", "nccl")
