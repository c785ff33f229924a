"""algorithms/powergossip_plan.py: the static half-step's plan, the views its compiled work runs on
(the step's bits: test_powergossip_buffers.py, test_powergossip.py)."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.algorithms.powergossip_plan import StaticPlan, sign_runs
from gossip_powersgd.algorithms.powergossip_state import EdgeFactors, MessageBuffers, StackedParams
from tests.algorithms.test_powergossip_state import pieces

# small_world:8:4:0.5 is irregular, and most peers have neighbours of smaller and of larger rank.
SPEC = "small_world:8:4:0.5"


def build(comm, rank, batch_neighbors=True):
    stacks = StackedParams(pieces(), rank=rank, min_compression_rate=1.0)
    messages = MessageBuffers(stacks, comm.neighbors)
    edges = EdgeFactors(stacks, messages, comm, seed=5, gamma=0.5)
    return StaticPlan(stacks, messages, edges, batch_neighbors), edges, messages


@pytest.mark.parametrize("rank", [1, 2])
def test_new_factors_are_the_larger_ends_product_minus_the_smaller_ends_at_both_ends(rank):
    """With this peer's products all 1 and every neighbour's all 2, the differences the plan
    forms are +1 towards a larger neighbour (its 2 minus our 1) and -1 towards a smaller one (our
    1 minus its 2): big minus small, whatever the order of the neighbours (rank 1: over the
    message rows at once; rank 2: group by group)."""

    def peer(comm):
        plan, edges, messages = build(comm, rank)
        messages.send_rows.fill_(1.0)
        messages.recv_rows.fill_(2.0)
        update = plan.work[("right", False)].update
        for first, second, out in zip(update.firsts, update.seconds, update.differences):
            torch.sub(first, second, out=out)
        signs = {}
        for j in comm.neighbors:
            values = {k: v for k, v in edges.factors(j).items() if k.endswith(".P")}
            assert all(v.numel() > 0 for v in values.values())
            signs[j] = {float(v.min()) for v in values.values()} | {
                float(v.max()) for v in values.values()
            }
        return comm.rank, signs, len(plan.runs)

    results = LocalCluster(topologies.parse(SPEC), cooperative=False).run(peer)
    assert max(runs for _, _, runs in results) == 2  # peers with neighbours on both sides
    for me, signs, _ in results:
        for j, values in signs.items():
            assert values == {1.0 if me < j else -1.0}, (me, j)


@pytest.mark.parametrize("batch_neighbors", [True, False])
def test_the_work_lists_cover_every_group_neighbour_and_the_exact_part(batch_neighbors):
    """Batched: one product and one update per group; else one per group and neighbour, each
    product written straight into that neighbour's message. The exact part is copied into the
    messages and mixed with W[i, j] and gamma only in the half-step that carries it."""

    def peer(comm):
        plan, edges, messages = build(comm, rank=2, batch_neighbors=batch_neighbors)
        deg, groups = len(comm.neighbors), len(plan.stacks.groups)
        per = 1 if batch_neighbors else deg
        for side in ("right", "left"):
            plain, full = plan.work[(side, False)], plan.work[(side, True)]
            assert len(plain.multiply.products) == groups * per
            assert len(plain.update.matrices) == groups * per
            assert len(full.multiply.copy_to) == len(plain.multiply.copy_to) + 1
            assert plain.update.exact is None and plain.update.weights == []
            assert full.update.exact is plan.stacks.exact
            assert full.update.weights == [
                comm.topology.weight(comm.rank, j) for j in comm.neighbors
            ]
            assert full.update.gamma == 0.5
            if not batch_neighbors:
                sends = [
                    messages.send_views[(g, side)][j] for g in range(groups) for j in comm.neighbors
                ]
                assert [p.data_ptr() for p in plain.multiply.products] == [
                    s.data_ptr() for s in sends
                ]
            for left, right, product in zip(*plain.multiply[:3]):
                assert torch.bmm(left, right).shape == product.shape
        assert set(plan.normalization) == set()  # rank 2 takes no_normalization
        return True

    assert all(LocalCluster(topologies.parse(SPEC), cooperative=False).run(peer))


def test_rank_one_normalises_every_groups_factors_at_once():
    def peer(comm):
        plan, edges, _ = build(comm, rank=1)
        norm = plan.normalization["right"]
        assert len(norm.factors) == len(plan.stacks.groups) and norm.norm_rows == [
            edges.norm_rows["right"]
        ]
        vectors = len(comm.neighbors) * sum(g.batch for g in plan.stacks.groups)
        return sum(n.numel() for n in norm.norms) == vectors == norm.norm_rows[0].numel()

    assert all(LocalCluster(topologies.parse(SPEC), cooperative=False).run(peer))


def test_sign_runs_split_the_neighbours_where_their_side_of_our_rank_changes():
    assert sign_runs(3, (5, 1, 0, 7, 8)) == [(0, 1, True), (1, 3, False), (3, 5, True)]
    assert sign_runs(0, (1, 2)) == [(0, 2, True)]
