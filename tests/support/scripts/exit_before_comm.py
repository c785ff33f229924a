"""Rank 1 ends its process (sys.exit(0)) before it creates its communicator; the other ranks of
ring:4 create theirs and must name it within seconds (for the fault tests, under mpiexec).

    mpiexec -n 4 python tests/support/scripts/exit_before_comm.py TIMEOUT

As the training CLI does once MPI is up, the script first asks to tell COMM_WORLD at exit.
"""

import sys

import topologies
from gossip_powersgd.comm.mpi import MPICommunicator, tell_world_at_exit
from gossip_powersgd.launch import main_guard


def main() -> int:
    from mpi4py import MPI

    tell_world_at_exit()
    if MPI.COMM_WORLD.Get_rank() == 1:
        sys.exit(0)  # plain code of the launched script, not a spec the trainer calls
    MPICommunicator(topologies.ring(4), timeout=float(sys.argv[1]))
    return 0


if __name__ == "__main__":
    main_guard(main)
