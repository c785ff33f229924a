"""PowerGossip's batched static half-step: one operation per group for all neighbours gives the same
bits as one per neighbour (the buffers themselves: test_powergossip_state.py), and a commit's own
PowerGossip loads beside this tree's."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, PowerGossip
from gossip_powersgd.algorithms.lowrank import orthonormalize_

# Two same-shape matrices, a conv weight, two biases and a matrix too small to compress.
SHAPES = [(12, 9), (12, 9), (6, 3, 2, 2), (12,), (2, 2), (6,)]


def peer_tensors(comm, dtype=torch.float64):
    g = torch.Generator().manual_seed(7 + comm.rank)
    return [torch.randn(s, generator=g, dtype=dtype) for s in SHAPES]


class PerBlockPowerGossip(PowerGossip):
    """Orthonormalises each neighbour's factor in its own call, as the step did before."""

    def _orthonormalize(self, plans, side):
        for plan in plans:
            for block, j in zip(plan.blocks, self.comm.neighbors):
                if not self.warm_start:
                    block.copy_(self.edges.draw(j, block.shape))
                orthonormalize_(block)


def run(comm, algorithm, rank, warm, steps=6, dtype=torch.float64, repoint=False):
    x = peer_tensors(comm, dtype)
    gossip = algorithm(x, comm, rank=rank, num_iterations=2, warm_start=warm)
    for step in range(steps):
        if repoint and step == 3:
            x[3].data = x[
                3
            ].data.clone()  # an exactly gossiped bias, re-pointed as model.to() would
            x[0].data = x[0].data.clone()
        gossip.step()
    factors = {j: {k: v.clone() for k, v in gossip.factors(j).items()} for j in comm.neighbors}
    return [t.clone() for t in x], factors


def bits(t):
    return t.contiguous().view(-1).view(torch.int64 if t.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("spec", ["ring:8", "small_world:8:4:0.5", "star:5"])
@pytest.mark.parametrize("rank, warm", [(1, True), (3, True), (2, False)])
def test_one_gram_schmidt_per_group_gives_the_per_neighbour_bits(spec, rank, warm):
    topology = topologies.parse(spec)
    for dtype in (torch.float32, torch.float64):
        batched = LocalCluster(topology).run(run, PowerGossip, rank, warm, dtype=dtype)
        per_block = LocalCluster(topology).run(run, PerBlockPowerGossip, rank, warm, dtype=dtype)
        for (xa, fa), (xb, fb) in zip(batched, per_block):
            assert all(torch.equal(bits(a), bits(b)) for a, b in zip(xa, xb))
            assert all(torch.equal(fa[j][k], fb[j][k]) for j in fa for k in fa[j])


def _readable(commit: str, helpers: bool) -> bool:
    from experiments.pages._commit_code import previous_powergossip

    return previous_powergossip(commit, helpers=helpers) is not None


@pytest.mark.skipif(not _readable("6df8d52", helpers=True), reason="needs commit 6df8d52")
def test_one_process_holds_a_commit_with_its_own_and_with_this_trees_helpers():
    import sys

    from experiments.pages._commit_code import loaded_modules, previous_powergossip
    from gossip_powersgd.algorithms import kernels

    own = previous_powergossip("6df8d52", helpers=True)
    tree = previous_powergossip("6df8d52", helpers=False)
    assert own is not tree and own.__module__ != tree.__module__
    assert loaded_modules("6df8d52", helpers=True) == [
        *("base", "exact", "kernels", "lowrank", "powergossip")
    ]
    assert loaded_modules("6df8d52", helpers=False) == ["powergossip"]
    # Each version's kernels are its own: the commit's module, or this tree's.
    own_kernels = sys.modules[own.__module__].multiply_into_messages
    assert own_kernels is not kernels.multiply_into_messages
    assert sys.modules[tree.__module__].multiply_into_messages is kernels.multiply_into_messages
