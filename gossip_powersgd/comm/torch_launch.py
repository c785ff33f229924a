"""Where a torch.distributed peer stands before it joins (`torch.TorchCommunicator`): its rank and
world size from torchrun's environment or mpiexec's mapped onto it (`launcher_environment`), and its
device and backend (`resolve_device`)."""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = "29500"

# (rank variable, size variable, local rank variable) of the launchers whose environment we map.
_MPI_LAUNCHERS = (
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
)


def launcher_environment() -> Tuple[int, int]:
    """(rank, world size) from torchrun's variables, or from mpiexec's mapped onto them.

    Sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT when an MPI launcher started us;
    raises a one-line ValueError when no launcher did.
    """
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        for rank_var, size_var, local_var in _MPI_LAUNCHERS:
            if rank_var in env and size_var in env:
                env["RANK"], env["WORLD_SIZE"] = env[rank_var], env[size_var]
                env.setdefault("LOCAL_RANK", env.get(local_var, env[rank_var]))
                break
        else:
            raise ValueError(
                "backend torch needs a launcher: torchrun --nproc-per-node N python -m "
                "... or mpiexec -n N python -m ... (N = the topology's size); RANK and "
                "WORLD_SIZE are not set"
            )
    env.setdefault("MASTER_ADDR", DEFAULT_MASTER_ADDR)
    env.setdefault("MASTER_PORT", DEFAULT_MASTER_PORT)
    try:
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    except ValueError:
        raise ValueError(
            f"RANK={env['RANK']!r} and WORLD_SIZE={env['WORLD_SIZE']!r} must be "
            "integers (set by torchrun or mpiexec)"
        ) from None
    _check_ranks(rank, world_size, env["MASTER_PORT"])
    return rank, world_size


def _check_ranks(rank: int, world_size: int, port: str) -> None:
    """Refuse in one line what no rendezvous can work with: before, RANK=-1 crashed the liveness
    thread with a traceback, and RANK=4 of WORLD_SIZE=4 or WORLD_SIZE=0 waited out the timeout and
    then blamed another rank or the timeout."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"RANK={rank} and WORLD_SIZE={world_size} do not fit: WORLD_SIZE must be >= 1 and "
            f"RANK from 0 to WORLD_SIZE-1 (start one process per rank, as torchrun or mpiexec do)"
        )
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(
            f"MASTER_PORT={port!r} is not a port number: set it to a free TCP port from 1 to 65535 "
            f"(the same on every rank), or unset it for {DEFAULT_MASTER_PORT}"
        )


def resolve_device(device, backend: Optional[str]) -> Tuple[torch.device, str]:
    """The device (a CUDA one indexed by LOCAL_RANK) and the torch.distributed backend (nccl for
    CUDA, gloo for the CPU) of this peer; a one-line ValueError for a pair that cannot work."""
    device = torch.device("cpu" if device is None else device)
    if backend is None:
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown torch.distributed backend {backend!r}; valid: gloo, nccl")
    if backend == "nccl" or device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{'backend nccl' if backend == 'nccl' else f'device {device}'} needs "
                "CUDA, which this machine does not have: use backend gloo on device cpu"
            )
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(
                f"backend nccl moves CUDA tensors only, but the device is {device}: "
                "use device cuda, or backend gloo on the CPU"
            )
        if device.index is None:
            device = torch.device("cuda", _local_gpu(backend))
    elif device.type != "cpu":
        raise ValueError(f"device {device} is not supported: use cpu (gloo) or cuda (nccl)")
    return device, backend


def _local_gpu(backend: str) -> int:
    """The GPU of this process: the LOCAL_RANK-th. Processes beyond the host's GPUs share them
    (LOCAL_RANK modulo their count) under gloo. NCCL cannot put two ranks on one GPU: there a host
    running more processes (torchrun's LOCAL_WORLD_SIZE, else this LOCAL_RANK + 1) than it has
    GPUs is refused in one line, by each of its processes alike (the index alone failed later, on
    the processes beyond the GPUs only, as CUDA's "invalid device ordinal")."""
    env = os.environ
    local, count = int(env.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    processes = max(local + 1, int(env.get("LOCAL_WORLD_SIZE", "0")))
    if backend == "nccl" and processes > count:
        raise ValueError(
            f"this host runs {processes} processes but has {count} GPU(s), and NCCL puts one "
            f"process on each: start at most {count} per host (torchrun --nproc-per-node "
            f"{count}), or use device cpu (gloo)"
        )
    return local % count


__all__ = ["DEFAULT_MASTER_ADDR", "DEFAULT_MASTER_PORT", "launcher_environment", "resolve_device"]
