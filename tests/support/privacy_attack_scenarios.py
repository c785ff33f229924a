"""Recorded-view scenarios run alike under `LocalCluster` and under mpiexec (tests/mpi_worker.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.privacy.views import ViewRecorder, observed_dir

#: Square matrices (so that full-rank PowerGossip determines them on every half-step) and a bias.
SHAPES = [(6, 6), (6, 6), (5, 5), (5,)]


def peer_tensors(comm, dtype=torch.float64):
    generator = torch.Generator().manual_seed(100 + comm.rank)
    return [torch.randn(s, generator=generator, dtype=dtype) for s in SHAPES]


def drift_(tensors, comm, step):
    """A small local change before each gossip step, standing in for an optimizer step."""
    generator = torch.Generator().manual_seed(1000 * comm.rank + step)
    for t in tensors:
        t.add_(torch.randn(t.shape, generator=generator, dtype=t.dtype), alpha=0.05)


def observed_gossip(comm, spec, steps, observers="all", directory=None, observe_every="1"):
    """Gossip `steps` rounds of `spec`, recording the views of `observers` ("all" or "0,3").

    Returns this peer's parameters after each step's local change (what it sent), its final
    parameters, and, on observers, the receive buffers its algorithm consumed at each step; views
    go to `directory`/observed/rank-K when a directory is given, else stay in memory.
    """
    steps, every = int(steps), int(observe_every)
    chosen = (
        range(comm.size) if observers == "all" else [int(k) for k in str(observers).split(",") if k]
    )
    x = peer_tensors(comm)
    algorithm = make_algorithm(spec, x, comm)
    recorder = None
    if comm.rank in chosen:
        where = observed_dir(directory, comm.rank) if directory is not None else None
        recorder = ViewRecorder(algorithm, where, every)
    sent, consumed = [], []
    for step in range(steps):
        drift_(x, comm, step)
        sent.append([t.clone() for t in x])
        algorithm.step()
        if recorder is not None:
            recorder.flush()
            consumed.append({j: _consumed(algorithm, j).clone() for j in comm.neighbors})
    result = {"sent": sent, "final": [t.clone() for t in x], "consumed": consumed}
    if recorder is not None and directory is None:
        result["records"] = recorder.records
    return result


def _consumed(algorithm, j):
    """The receive buffer algorithm `algorithm` read neighbour j's last message from."""
    if algorithm.name in ("choco", "deepsqueeze"):
        return algorithm._messages.recv[j]
    if algorithm.name == "powergossip":
        numel = algorithm._message_numel  # the step's only half-step: with the exact part
        side = "right" if algorithm.half_steps % 2 == 1 else "left"
        return algorithm._recv[j][: numel[(side, algorithm._exact is not None)]]
    return algorithm._recv[j]


def mpi_observed_gossip(comm, out_dir, spec, steps):
    """`observed_gossip` under mpiexec with rank 3 observing, views written under `out_dir`."""
    return observed_gossip(comm, spec, steps, observers="3", directory=Path(out_dir))
