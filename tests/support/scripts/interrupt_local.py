"""Peers gossiping forever in one process, under main_guard; prints "ready" once all are running.

The test sends SIGINT after reading "ready": every peer thread must stop, the process must print one
line and exit with status 130 (not 134 from native threads torn down at interpreter exit).
"""

import sys

import torch

import topologies
from gossip_powersgd import ExactGossip, LocalCluster
from gossip_powersgd.launch import main_guard


def peer(comm):
    params = [torch.randn(64, 64)]
    gossip = ExactGossip(params, comm)
    gossip.step()
    if comm.rank == 0:
        print("ready", flush=True)
    while True:
        gossip.step()
        torch.mm(params[0], params[0])  # some native compute between exchanges, as in training


def main():
    torch.set_num_threads(1)
    LocalCluster(topologies.ring(4)).run(peer)


if __name__ == "__main__":
    main_guard(main)
    sys.exit(3)  # not reached: main_guard exits
