"""One rank of a torch.distributed job across emulated hosts (RANK, WORLD_SIZE, MASTER_* set by the
test): an all-reduce of rank + 1 through `TorchCommunicator`; prints the rank, this host's name,
the interface gloo was bound to and the sum."""

import os
import socket

import torch

import topologies
from gossip_powersgd import TorchCommunicator

torch.set_num_threads(1)
comm = TorchCommunicator(topologies.parse(f"ring:{os.environ['WORLD_SIZE']}"), timeout=60)
total = comm.allreduce_(torch.tensor([comm.rank + 1.0]), "sum")
print(comm.rank, socket.gethostname(), os.environ.get("GLOO_SOCKET_IFNAME"), total.item())
comm.close()
