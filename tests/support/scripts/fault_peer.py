"""Four peers gossiping on ring:4 for the fault tests, under mpiexec or torchrun.

    mpiexec -n 4 python tests/support/scripts/fault_peer.py mpi TIMEOUT [exit:RANK:CODE | raise:RANK]
    torchrun --nproc-per-node 4 tests/support/scripts/fault_peer.py torch TIMEOUT [exit:RANK:CODE | raise:RANK]

Every rank prints `ready RANK PID` after a few gossip steps and goes on gossiping, so that a test can
stop or kill one of them; `exit:RANK:CODE` makes RANK call sys.exit(CODE) a few steps later, as user
code (a dataset module, a hook) may, and `raise:RANK` makes it raise an exception instead. TIMEOUT is the communicator's comm timeout (seconds).
"""

import os
import sys

import torch

import topologies
from gossip_powersgd import ExactGossip
from gossip_powersgd.launch import main_guard

STEPS = 200_000  # far more than a test waits for: the test's timeout ends a run that hangs


def main() -> int:
    backend, timeout = sys.argv[1], float(sys.argv[2])
    action = sys.argv[3].split(":") if len(sys.argv) > 3 else []
    torch.set_num_threads(1)
    if backend == "mpi":
        from gossip_powersgd import MPICommunicator as Transport
    else:
        from gossip_powersgd import TorchCommunicator as Transport
    comm = Transport(topologies.ring(4), timeout=timeout)
    gossip = ExactGossip([torch.full((16,), float(comm.rank))], comm)
    for step in range(STEPS):
        gossip.step()
        if step == 3:
            print(f"ready {comm.rank} {os.getpid()}", flush=True)
        if action and comm.rank == int(action[1]) and step == 20:
            if action[0] == "exit":
                sys.exit(int(action[2]))
            raise ValueError(f"rank {comm.rank} found something wrong")
    return 0


if __name__ == "__main__":
    main_guard(main)
