"""algorithms/layout.py: what an algorithm's messages hold, for an observer that never looks inside
the algorithm (each algorithm's own layout: its test file; the views that record them:
tests/privacy/test_views.py)."""

import pytest
import torch

import topologies
from gossip_powersgd import ExactGossip, LocalCluster
from gossip_powersgd.algorithms.allreduce import AllReduce
from gossip_powersgd.algorithms.layout import (
    MessageLayout,
    NoMessages,
    Undeclared,
    WholeModel,
    unflatten,
)

SHAPES = [[2, 3], [4], [1, 2, 2]]


def test_unflatten_gives_copies_shaped_like_each_piece_in_order():
    flat = torch.arange(14.0)
    pieces = unflatten(flat, SHAPES)
    assert [list(p.shape) for p in pieces] == SHAPES
    assert torch.equal(torch.cat([p.reshape(-1) for p in pieces]), flat)
    pieces[0].fill_(-1)
    assert flat[0] == 0  # copies: the message stays as delivered


def test_a_live_algorithms_layout_holds_its_shapes_dtype_observer_and_neighbours():
    def peer(comm):
        params = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
        layout = ExactGossip.layout.of(ExactGossip(params, comm))
        return layout.meta, layout.fields, type(layout)

    for rank, (meta, fields, kind) in enumerate(
        LocalCluster(topologies.ring(4), cooperative=False).run(peer)
    ):
        assert meta == {
            "shapes": SHAPES,
            "dtype": "float64",
            "observer": rank,
            "neighbors": sorted({(rank - 1) % 4, (rank + 1) % 4}),
        }
        assert fields == {} and kind is WholeModel


def test_exact_gossips_message_decodes_to_the_senders_parameters():
    sender = [torch.randn(s, dtype=torch.float64) for s in SHAPES]
    message = {"tensor": torch.cat([t.reshape(-1) for t in sender]), "sender": 2, "step": 0}
    (part,) = WholeModel({"shapes": SHAPES, "dtype": "float64"}).decode(message)
    assert part.kind == "model" and part.indices == [0, 1, 2]
    assert all(torch.equal(a, b) for a, b in zip(part.values, sender))


def test_layouts_that_decode_nothing_say_why_and_what_to_do():
    meta = {"shapes": SHAPES, "dtype": "float32", "algorithm": "mine"}
    assert AllReduce.layout is NoMessages and not NoMessages.point_to_point
    with pytest.raises(ValueError, match="sends no point-to-point messages .*all-reduces"):
        NoMessages(meta).decode({})
    with pytest.raises(
        ValueError, match=r"^algorithm 'mine' declares no message layout: set its class's `layout`"
    ):
        Undeclared(meta).decode({})
    with pytest.raises(NotImplementedError):
        MessageLayout(meta).decode({})
    assert MessageLayout(meta).annotate(None, 0) == {"kind": ""}
