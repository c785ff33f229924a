"""algorithms/powergossip_state.py: PowerGossip's memory (stacked parameters, message buffers, the
factors and generators each edge shares) and its state."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, PowerGossip
from gossip_powersgd.algorithms.powergossip import edge_seed
from gossip_powersgd.algorithms.powergossip_state import (
    EdgeFactors,
    MessageBuffers,
    StackedParams,
    aligned_numel,
    round_up,
    segments_of,
)
from tests.algorithms.test_powergossip import peer_tensors as model_tensors
from tests.algorithms.test_powergossip_buffers import bits, peer_tensors, run


def test_edge_seeds_do_not_collide():
    seeds = {edge_seed(0, i, j) for i in range(40) for j in range(i + 1, 40)}
    assert len(seeds) == 40 * 39 // 2
    assert edge_seed(0, 1, 12) != edge_seed(0, 11, 2)
    assert edge_seed(0, 3, 5) == edge_seed(0, 5, 3)


def test_parameters_re_pointed_elsewhere_are_re_stacked():
    def peer(comm):
        x = model_tensors(comm)
        gossip = PowerGossip(x, comm)
        gossip.step()
        x[1].data = x[1].data.clone()  # as model.to(...) would do
        gossip.step()
        return x, gossip.stacks.groups[0].matrices.clone()

    for x, stacked in LocalCluster(topologies.ring(4)).run(peer):
        assert torch.equal(stacked[1], x[1])


def test_state_from_another_model_or_topology_is_refused_naming_the_key():
    def saved_state(comm, rows):
        return PowerGossip([torch.zeros(rows, 6)], comm, rank=1).state_dict()

    def load(comm, states, rows):
        PowerGossip([torch.zeros(rows, 6)], comm, rank=1).load_state_dict(states[comm.rank])

    ring = LocalCluster(topologies.ring(4)).run(saved_state, 8)
    with pytest.raises(
        ValueError, match=r"state 'factor\.\d\.0\.P' has shape \(1, 8, 1\), expected \(1, 9, 1\)"
    ):
        LocalCluster(topologies.ring(4)).run(load, ring, 9)
    with pytest.raises(
        ValueError,
        match=r"PowerGossip state has no 'factor\.\d\.0\.P': it was saved for another model",
    ):
        LocalCluster(topologies.complete(4)).run(load, ring, 8)


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


# ---- the pieces on their own -----------------------------------------------------------------------

# Two same-shape matrices (one group of batch 2), a conv weight (its own group) and three tensors
# gossiped exactly (two biases and a matrix too small to compress).
PIECES = [(12, 9), (6,), (12, 9), (6, 3, 2, 2), (2, 2), (12,)]


def pieces(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(s, generator=g, dtype=dtype) for s in PIECES]


def test_round_up_and_aligned_numel_are_their_closed_forms():
    assert [round_up(v, 8) for v in (0, 1, 8, 9, 16)] == [0, 8, 8, 16, 16]
    assert aligned_numel(torch.float64) == 8 and aligned_numel(torch.float32) == 16
    assert aligned_numel(torch.complex128) == 4 and aligned_numel(torch.uint8) == 64


def test_segments_of_is_every_rows_segment_as_one_view():
    rows = torch.arange(3 * 20.0).view(3, 20)
    view = segments_of(rows, 4, 2, 3)  # (batch 2, deg 3, 3) from offset 4
    assert view.shape == (2, 3, 3)
    for n in range(3):
        assert torch.equal(view[:, n], rows[n, 4:10].view(2, 3))
    view[1, 2, 0] = -1.0  # a view: writes land in the rows
    assert rows[2, 7] == -1.0


def test_stacked_params_are_views_of_the_stacks_with_their_values_kept():
    """Each compressed tensor is a slot of its group's (batch, rows, cols) buffer, each exactly
    gossiped one a slice of the flat `exact` buffer, in parameter order; values and identities are
    unchanged; restack is a no-op until a parameter is re-pointed, then it re-homes it."""
    x = pieces()
    before, ids = [t.clone() for t in x], [id(t) for t in x]
    stacks = StackedParams(x, rank=2, min_compression_rate=1.0)
    assert [(g.indices, g.rows, g.cols, g.rank) for g in stacks.groups] == [
        ([0, 2], 12, 9, 2),
        ([3], 6, 12, 2),
    ]
    assert stacks.exact_indices == [1, 4, 5]
    assert [id(t) for t in x] == ids and all(torch.equal(a, b) for a, b in zip(x, before))
    matrices = stacks.groups[0].matrices
    assert x[2].data_ptr() == matrices[1].data_ptr()
    assert torch.equal(stacks.exact, torch.cat([before[k].reshape(-1) for k in (1, 4, 5)]))
    assert x[4].data_ptr() == stacks.exact[6:10].data_ptr()
    assert stacks.restack() is False
    x[5].data = torch.full((12,), 7.0, dtype=torch.float64)  # as model.to(...) would re-point it
    x[0].data = before[0].clone() + 1
    assert stacks.restack() is True
    assert x[5].data_ptr() == stacks.exact[10:].data_ptr() and float(stacks.exact[10:].min()) == 7
    assert x[0].data_ptr() == matrices[0].data_ptr() and torch.equal(matrices[0], before[0] + 1)
    assert stacks.restack() is False


@pytest.mark.parametrize(
    "move, where",
    [
        (lambda model: model.double(), "torch.float64/cpu"),
        pytest.param(
            lambda model: model.to("cuda"),
            "torch.float32/cuda:0",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
        ),
    ],
    ids=["double", "cuda"],
)
def test_a_model_moved_to_another_dtype_or_device_after_building_is_refused(move, where):
    """The stacks, messages and factors keep the dtype and device they were built in: re-stacked,
    a group of two same-shape matrices was copied back into float32, and a single-matrix group
    (its buffer the parameter's own memory) failed with a raw error inside the kernels."""

    def peer(comm):
        torch.manual_seed(comm.rank)
        layers = [torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 8)]
        model = torch.nn.Sequential(*layers)  # a group of two 16x16, one of one 8x16, biases
        gossip = PowerGossip(model.parameters(), comm, rank=1)
        gossip.step()
        move(model)
        gossip.step()

    message = (
        rf"^PowerGossip: the model moved to {where} after the algorithm was built "
        r"\(on torch\.float32/cpu\): build it after model\.to\(\.\.\.\)$"
    )
    with pytest.raises(ValueError, match=message):
        LocalCluster(topologies.ring(2), cooperative=False).run(peer)


def test_message_sizes_and_segments_follow_the_layout():
    """A right half-step's message is every group's batch x rank x rows products, a left one's
    batch x rank x cols, then the exact part on a step's first half-step; segments lie end to end,
    every neighbour's views alias its row, and a row holds the largest message, 64-byte aligned."""
    stacks = StackedParams(pieces(), rank=2, min_compression_rate=1.0)
    messages = MessageBuffers(stacks, neighbors=[4, 1])
    right, left, exact = 2 * 2 * 12 + 1 * 2 * 6, 2 * 2 * 9 + 1 * 2 * 12, 6 + 4 + 12
    assert messages.numel == {
        ("right", False): right,
        ("right", True): right + exact,
        ("left", False): left,
        ("left", True): left + exact,
    }
    assert messages.send_rows.shape == (2, round_up(max(right, left) + exact, 8))
    assert messages.segments[(0, "right")] == (0, 48)
    assert messages.segments[(1, "right")] == (48, 12)
    assert messages.segments[("exact", "right")] == (60, exact)
    assert messages.segments[("exact", "left")] == (60, exact)  # left = 36 + 24 = 60 too
    view = messages.recv_views[(1, "left")][1]
    assert view.shape == (1, 2, 12)
    assert view.data_ptr() == messages.recv_rows[1, 36:].data_ptr()
    send, recv = messages.exchange[("right", True)]
    assert send[4].numel() == recv[1].numel() == right + exact
    assert messages.outgoing[("left", False)].shape == (2, left)


def _edges(comm, x):
    stacks = StackedParams(x, rank=2, min_compression_rate=1.0)
    return EdgeFactors(stacks, MessageBuffers(stacks, comm.neighbors), comm, seed=5, gamma=1.0)


def test_edge_factors_start_alike_at_both_ends_with_opposite_signs():
    """Both ends of an edge draw the first Q from the edge's own generator (the same bits), P
    starts at zero, and the signs are +1 at the smaller end, -1 at the larger: opposite updates."""

    def peer(comm):
        edges = _edges(comm, pieces())
        return {j: {k: v.clone() for k, v in edges.factors(j).items()} for j in edges.neighbors}, {
            j: s for j, s in zip(edges.neighbors, edges.signs)
        }

    results = LocalCluster(topologies.parse("star:4"), cooperative=False).run(peer)
    for i, j in topologies.parse("star:4").edges():
        mine, theirs = results[i][0][j], results[j][0][i]
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert not torch.any(mine["0.P"]) and torch.any(mine["0.Q"])
        assert results[i][1][j] == -results[j][1][i] == (1.0 if i < j else -1.0)
    assert not torch.equal(results[0][0][1]["0.Q"], results[0][0][2]["0.Q"])  # edges differ


def test_edge_state_round_trips_on_a_schedule_and_is_refused_on_a_static_topology():
    def peer(comm):
        edges = _edges(comm, pieces())
        j = edges.neighbors[0]
        if edges.counters is None:
            with pytest.raises(ValueError, match="static topology keeps no per-edge counters"):
                edges.load_edge_state(j, edges.edge_state(j, half_steps=3))
            return None
        edges.counters[j] = 5
        saved = edges.edge_state(j, half_steps=0)
        expected = edges.draw(j, (2, 2, 9))  # the generator moves on from the saved state
        for tensor in edges.factors(j).values():
            tensor.fill_(0.5)
        edges.counters[j] = 0
        edges.load_edge_state(j, saved)
        assert edges.counters[j] == 5 and saved["half_steps"] == 5
        assert all(torch.equal(edges.factors(j)[k], saved[k]) for k in edges.factors(j))
        return torch.equal(edges.draw(j, (2, 2, 9)), expected)

    assert LocalCluster(topologies.ring(3), cooperative=False).run(peer) == [None] * 3
    assert all(LocalCluster(topologies.parse("matchings:4"), cooperative=False).run(peer))


def test_a_static_topologys_state_is_refused_on_a_schedule_naming_the_key():
    static = LocalCluster(topologies.complete(4), cooperative=False).run(
        lambda comm: _edges(comm, pieces()).state_dict()
    )

    def load(comm):
        _edges(comm, pieces()).load_state_dict(static[comm.rank])

    with pytest.raises(ValueError, match="has no 'edge_half_steps.\\d': it was saved on a static"):
        LocalCluster(topologies.parse("matchings:4"), cooperative=False).run(load)


@pytest.mark.parametrize("schedule", ["matchings:4", "one_peer_exponential:4"])
def test_a_schedules_state_is_refused_on_a_static_topology_naming_both(schedule):
    # complete:4 is each schedule's union graph: the same neighbours, the same factors' shapes,
    # so only the per-edge counters tell the kinds apart
    scheduled = LocalCluster(topologies.parse(schedule), cooperative=False).run(
        lambda comm: _edges(comm, pieces()).state_dict()
    )
    assert all("edge_half_steps.1" in state or "edge_half_steps.0" in state for state in scheduled)

    def load(comm):
        _edges(comm, pieces()).load_state_dict(scheduled[comm.rank])

    with pytest.raises(ValueError) as info:
        LocalCluster(topologies.complete(4), cooperative=False).run(load)
    assert str(info.value) == (
        "PowerGossip state has per-edge counters ('edge_half_steps.<j>'): it was saved on a "
        "schedule, and this run uses a static topology; resume on that schedule"
    )
