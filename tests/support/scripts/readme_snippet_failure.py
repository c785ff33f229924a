"""The README's library path without main_guard: rank 2 raises, the other ranks wait in a gossip step.

Run as `mpiexec -n 4 python tests/support/scripts/readme_snippet_failure.py`; the job must end within seconds
(the abort hook that MPICommunicator installs), naming rank 2.
"""

import torch

import topologies
from gossip_powersgd import ExactGossip, MPICommunicator

comm = MPICommunicator(topologies.ring(4), timeout=120)
params = [torch.full((3,), float(comm.rank))]
gossip = ExactGossip(params, comm)
if comm.rank == 2:
    raise ValueError("rank 2 found something wrong with its data")
for _ in range(10):
    gossip.step()
