"""Misbehaving MPI programs, one per bad input; each must end with a clear error on every rank.

mpiexec -n 3 python tests/support/mpi_bad_inputs.py CASE
"""

import sys

import torch

import topologies
from gossip_powersgd import ExactGossip, MPICommunicator
from gossip_powersgd.launch import main_guard


def world_size() -> None:
    MPICommunicator(topologies.ring(8))  # launched with fewer ranks than the topology has peers


def topologies_differ() -> None:
    from mpi4py import MPI

    n = MPI.COMM_WORLD.Get_size()
    spec = "star" if MPI.COMM_WORLD.Get_rank() == n - 1 else "ring"  # star:3 is no ring:3
    MPICommunicator(topologies.parse(spec, n=n))


def shapes_differ() -> None:
    from mpi4py import MPI

    comm = MPICommunicator(topologies.ring(MPI.COMM_WORLD.Get_size()))
    rows = 6 if comm.rank == 2 else 5
    ExactGossip([torch.zeros(rows, 3)], comm)


def message_size() -> None:
    from mpi4py import MPI

    comm = MPICommunicator(topologies.ring(MPI.COMM_WORLD.Get_size()), timeout=20)
    size = 7 if comm.rank == 1 else 5  # rank 1 sends a message of the wrong size
    send = {j: torch.zeros(size) for j in comm.neighbors}
    recv = {j: torch.zeros(5) for j in comm.neighbors}
    comm.exchange(send, recv)


def silent_peer() -> None:
    from mpi4py import MPI

    comm = MPICommunicator(topologies.ring(MPI.COMM_WORLD.Get_size()), timeout=3)
    if comm.rank == 2:
        import time

        time.sleep(30)  # never sends: its neighbours must give up naming it
        return
    comm.exchange(
        {j: torch.zeros(4) for j in comm.neighbors}, {j: torch.zeros(4) for j in comm.neighbors}
    )


def ops_differ() -> None:
    from mpi4py import MPI

    comm = MPICommunicator(topologies.ring(MPI.COMM_WORLD.Get_size()), timeout=20)
    # rank 0 sums where the others average: before, every rank got a silently mixed result
    comm.allreduce_(torch.ones(5), op="sum" if comm.rank == 0 else "mean")


CASES = {
    f.__name__: f
    for f in (world_size, topologies_differ, shapes_differ, message_size, silent_peer, ops_differ)
}

if __name__ == "__main__":
    main_guard(CASES[sys.argv[1]])
