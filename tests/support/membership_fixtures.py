"""The churned gossip run the membership tests share (tests/membership/test_peer.py,
test_algorithm.py): a model of three tensors per peer and a schedule of two leaves and two joins."""

from __future__ import annotations

import torch

SHAPES = [(10, 12), (12, 10), (7,)]
CHURN = "leave:3@4,leave:5@7,join:3@12,join:5@16"
STEPS = 22


def peer_tensors(comm, dtype):
    g = torch.Generator().manual_seed(42 + comm.rank)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in SHAPES]
