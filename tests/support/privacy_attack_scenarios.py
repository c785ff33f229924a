"""Recorded-view scenarios run alike under `LocalCluster` and under mpiexec (tests/mpi_worker.py),
and the small runs the attack tests share (tests/privacy/test_attacks.py, test_reconstruction.py,
test_estimators.py, test_heldout.py, test_membership.py, test_attack_run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.privacy.views import (
    RecordingCommunicator,
    ViewRecorder,
    load_view,
    observed_dir,
)
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
RING = topologies.ring(4)
#: The held-out split's dataset: small enough that every split is made in milliseconds.
SPLIT_DATA = "synthetic_logreg:d=8,classes=4,n=800"

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
    # The receive buffers the algorithm hands its communicator, kept by reference (not copied)
    # so that they are read after the step: the bytes the step consumed, known without looking
    # inside the algorithm.
    delivered: Dict[int, torch.Tensor] = {}
    algorithm = make_algorithm(
        spec, x, RecordingCommunicator(comm, lambda send, recv: delivered.update(recv))
    )
    recorder = None
    if comm.rank in chosen:
        where = observed_dir(directory, comm.rank) if directory is not None else None
        recorder = ViewRecorder(algorithm, where, every)
    sent, consumed = [], []
    for step in range(steps):
        drift_(x, comm, step)
        sent.append([t.clone() for t in x])
        delivered.clear()
        algorithm.step()
        if recorder is not None:
            recorder.flush()
            consumed.append({j: buffer.clone() for j, buffer in delivered.items()})
    result = {"sent": sent, "final": [t.clone() for t in x], "consumed": consumed}
    if recorder is not None and directory is None:
        result["records"] = recorder.records
    return result


def mpi_observed_gossip(comm, out_dir, spec, steps):
    """`observed_gossip` under mpiexec with rank 3 observing, views written under `out_dir`."""
    return observed_gossip(comm, spec, steps, observers="3", directory=Path(out_dir))


def run_views(spec, steps=4, observe_every=1, tmp=None):
    """Gossip on a 4-ring with every rank observing; returns (results, views by rank)."""
    results = LocalCluster(RING, timeout=30).run(
        observed_gossip, spec, steps, "all", tmp, str(observe_every)
    )
    views = [load_view(observed_dir(tmp, k)) for k in range(4)] if tmp is not None else None
    return results, views


def tiny(**changes):
    base = load_config(TINY, deep=False).replace(
        quiet=True, checkpoint_every=0, log_every=0, epochs=1
    )
    return base.replace(**changes)


def train_all(config, make_hooks):
    hooks = {}

    def peer(comm):
        hooks[comm.rank] = make_hooks()
        return train(comm, config, hooks=[hooks[comm.rank]])

    return LocalCluster(topologies.parse(config.topology), timeout=60).run(peer), hooks
