"""algorithms/powergossip_layout.py: what each PowerGossip message holds, decoded from the saved
meta alone (the messages of real runs, recorded by a curious neighbour: tests/privacy/)."""

import torch

import topologies
from gossip_powersgd import LocalCluster, PowerGossip
from gossip_powersgd.algorithms.powergossip_layout import LowRankProducts

META = {
    "shapes": [[12, 9], [6], [12, 9], [3, 4]],
    "dtype": "float64",
    "groups": [[[0, 2], 12, 9, 2]],  # one group: two 12 x 9 matrices at rank 2
    "exact_indices": [1, 3],
}


def message(kind, with_exact):
    width = 12 if kind == "right" else 9
    block = torch.randn(2, 2, width, dtype=torch.float64)
    exact = [torch.randn(6, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)]
    parts = [block.reshape(-1)] + ([t.reshape(-1) for t in exact] if with_exact else [])
    factor = torch.randn(2, 9 if kind == "right" else 12, 2, dtype=torch.float64)
    return (
        {"tensor": torch.cat(parts), "kind": kind, "factors": {"0": factor}},
        block,
        exact,
        factor,
    )


def test_a_right_half_step_with_the_exact_part_decodes_to_products_and_models():
    sent, block, exact, factor = message("right", with_exact=True)
    low_rank, model = LowRankProducts(META).decode(sent)
    assert (low_rank.kind, low_rank.indices, low_rank.rows, low_rank.cols) == (
        "right",
        [0, 2],
        12,
        9,
    )
    assert torch.equal(low_rank.block, block) and low_rank.factor is factor
    assert model.kind == "model" and model.indices == [1, 3]
    assert all(torch.equal(a, b) for a, b in zip(model.values, exact))


def test_a_left_half_step_without_the_exact_part_is_products_only():
    sent, block, _, _ = message("left", with_exact=False)
    (low_rank,) = LowRankProducts(META).decode(sent)
    assert low_rank.kind == "left" and low_rank.block.shape == (2, 2, 9)
    assert torch.equal(low_rank.block, block)


def test_a_live_peer_records_its_groups_and_each_edges_side_and_shared_factor():
    def peer(comm):
        g = torch.Generator().manual_seed(comm.rank)
        x = [torch.randn(s, generator=g, dtype=torch.float64) for s in META["shapes"]]
        gossip = PowerGossip(x, comm, rank=2, min_compression_rate=1.0)
        layout = LowRankProducts.of(gossip)
        gossip.step()
        j = comm.neighbors[0]
        note = layout.annotate(gossip, j)
        letter = "Q" if note["kind"] == "right" else "P"
        return (
            layout.fields,
            note["kind"],
            torch.equal(note["factors"]["0"], gossip.factors(j)[f"0.{letter}"]),
        )

    for fields, kind, same in LocalCluster(topologies.ring(3), cooperative=False).run(peer):
        assert fields == {"groups": META["groups"], "exact_indices": [1, 3]}
        assert kind in ("right", "left") and same
