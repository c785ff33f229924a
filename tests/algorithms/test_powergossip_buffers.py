"""PowerGossip's batched static half-step: one operation per group for all neighbours gives the same
bits as one per neighbour, the exact part lives in one buffer, and the simulation benchmark runs."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, PowerGossip
from gossip_powersgd.algorithms.lowrank import orthonormalize_
from gossip_powersgd.algorithms.powergossip_plan import sign_runs

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


# Large enough for BLAS kernels (not the small-matrix loops), which round a product of a strided
# operand by where its rows sit: the products differ, and the factors must not.
RESNET_LIKE = [(16, 3, 3, 3), (32, 16, 3, 3), (32, 16, 3, 3), (64, 32, 3, 3), (10, 64), (64,)]


@pytest.mark.parametrize(
    "spec", ["star:5", "small_world:8:4:0.5"]
)  # irregular: degrees differ per end
def test_rank_one_factors_live_in_message_rows_and_are_bit_identical_at_both_ends(spec):
    def peer(comm):
        g = torch.Generator().manual_seed(comm.rank)
        x = [torch.randn(s, generator=g) for s in RESNET_LIKE]
        before = torch.cat([t.reshape(-1) for t in x])
        gossip = PowerGossip(x, comm, rank=1)
        rows = gossip.edges.factor_rows
        start = {name: t.data_ptr() for name, t in rows.items()}
        inside = all(
            start[name] <= getattr(group, name).data_ptr() < start[name] + rows[name].nbytes
            for group in gossip.stacks.groups
            for name in ("left", "right", "scaled_left")
        )
        history = []
        for _ in range(5):
            gossip.step()
            history.append(
                {j: {k: v.clone() for k, v in gossip.factors(j).items()} for j in comm.neighbors}
            )
        return inside, history, before, torch.cat([t.reshape(-1) for t in x])

    topology = topologies.parse(spec)
    results = LocalCluster(topology).run(peer)
    assert all(inside for inside, _, _, _ in results)
    for i, j in topology.edges():
        for step in range(5):
            mine, theirs = results[i][1][step][j], results[j][1][step][i]
            assert all(torch.equal(mine[k], theirs[k]) for k in mine), (i, j, step)
    before = torch.stack([r[2] for r in results]).double().mean(0)
    after = torch.stack([r[3] for r in results]).double().mean(0)
    assert float((after - before).abs().max()) < 1e-5 * float(before.abs().max())
    assert float((results[0][3] - results[0][2]).abs().max()) > 1e-3  # the step did move the model


def test_exact_tensors_are_views_of_one_buffer_and_re_stacked_when_re_pointed():
    def peer(comm):
        x = peer_tensors(comm)
        gossip = PowerGossip(x, comm)
        exact = [x[k] for k in range(len(x)) if k not in gossip.compressed_indices]
        buffer = gossip.stacks.exact
        start, end = buffer.data_ptr(), buffer.data_ptr() + buffer.nbytes
        return all(start <= t.data_ptr() < end for t in exact) and len(exact) == 3

    assert all(LocalCluster(topologies.ring(4)).run(peer))
    topology = topologies.parse("small_world:8:4:0.5")
    straight = LocalCluster(topology).run(run, PowerGossip, 1, True)
    repointed = LocalCluster(topology).run(run, PowerGossip, 1, True, repoint=True)
    for (xa, _), (xb, _) in zip(straight, repointed):
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(xa, xb))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_message_rows_start_on_64_byte_boundaries(dtype):
    def peer(comm):
        gossip = PowerGossip(peer_tensors(comm, dtype), comm)
        return [row.data_ptr() % 64 for row in gossip.messages.send.values()] + [
            row.data_ptr() % 64 for row in gossip.messages.recv.values()
        ]

    for offsets in LocalCluster(topologies.parse("small_world:8:4:0.5")).run(peer):
        assert offsets and set(offsets) == {0}


def test_sign_runs_split_the_neighbours_where_their_side_of_our_rank_changes():
    assert sign_runs(3, (5, 1, 0, 7, 8)) == [(0, 1, True), (1, 3, False), (3, 5, True)]
    assert sign_runs(0, (1, 2)) == [(0, 2, True)]


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
