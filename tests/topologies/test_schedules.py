"""Tests for topologies.schedules: the time-varying topologies (one-peer exponential, random
matchings, edge sampling, cyclic lists), their spellings and one-line errors, and their size limit.
What every schedule shares: test_schedule_base.py and test_stepcache.py; directed ones:
test_directed.py; `python -m topologies show` of a schedule: test_main.py."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import topologies
from topologies import Topology
from tests.topologies._support import product


def assert_valid_step(t: Topology) -> None:
    """Every step's W: symmetric, doubly stochastic, non-negative off the diagonal."""
    W = t.W
    np.testing.assert_array_equal(W, W.T)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
    assert (W - np.diag(np.diag(W))).min() >= 0


# --- one-peer exponential ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_one_peer_exponential_averages_exactly_in_log2_n_steps(n):
    s = topologies.one_peer_exponential(n)
    log2n = n.bit_length() - 1
    assert s.period == log2n
    np.testing.assert_allclose(product(s, log2n), np.full((n, n), 1.0 / n), atol=1e-15)
    assert topologies.product_gap(s) == pytest.approx(1.0, abs=1e-12)
    for t in range(2 * log2n):
        step = s.at(t)
        assert_valid_step(step)
        for i in range(n):
            partner = i ^ (1 << (t % log2n))
            assert step.neighbors(i) == (partner,)
            assert step.weight(i, partner) == 0.5 and step.weight(i, i) == 0.5


def test_one_peer_exponential_union_is_the_hypercube():
    s = topologies.parse("one_peer_exponential:16")
    assert s == topologies.one_peer_exponential(16) and s.name == "one_peer_exponential:16"
    assert sorted(s.union.edges()) == sorted(topologies.hypercube(4).edges())
    np.testing.assert_array_equal(s.union.W, topologies.hypercube(4).W)  # metropolis, like union
    assert s.neighbors_union(0) == (1, 2, 4, 8)
    assert topologies.parse("one_peer_exponential", n=8).name == "one_peer_exponential:8"
    assert s.at(5) is s.at(1)  # periodic: the same cached step


# --- random perfect matchings --------------------------------------------------------------------


def test_matching_step_averages_each_pair():
    s = topologies.matchings(16)
    x = np.arange(16.0) ** 2
    for t in range(5):
        step = s.at(t)
        assert_valid_step(step)
        assert step.degrees == (1,) * 16
        mixed = step.W @ x
        for i, j in step.edges():
            assert mixed[i] == mixed[j] == (x[i] + x[j]) / 2


def test_matchings_are_pure_functions_of_seed_and_step():
    forward = topologies.matchings(16, seed=3)
    backward = topologies.parse("matchings:16:3")
    steps = range(3 * 8 + 5)  # more than the cache holds
    edges_forward = [forward.at(t).edges() for t in steps]
    edges_backward = [backward.at(t).edges() for t in reversed(steps)][::-1]
    assert edges_forward == edges_backward
    assert len({tuple(e) for e in edges_forward}) > 1  # the graph does change
    other = topologies.matchings(16, seed=4)
    assert [other.at(t).edges() for t in steps] != edges_forward
    assert forward.fingerprint == backward.fingerprint != other.fingerprint
    clone = pickle.loads(pickle.dumps(forward))
    assert clone == forward and clone.at(7).edges() == forward.at(7).edges()


def test_matchings_union_is_every_pair_and_names_round_trip():
    s = topologies.parse("matchings:8")
    assert s.period is None and not s.is_directed
    assert s.union.edges() == topologies.complete(8).edges()
    assert s.name == "matchings:8" and topologies.parse("matchings:8:5").name == "matchings:8:5"
    assert topologies.parse("matchings", n=6) == topologies.matchings(6)


# --- edge sampling -------------------------------------------------------------------------------


def test_edge_sampling_uses_metropolis_weights_on_the_active_edges():
    base = topologies.torus(4, 4)
    s = topologies.parse("edge_sampling:torus:4x4:0.5")
    assert s == topologies.edge_sampling(base, 0.5) and s.base == base and s.p == 0.5
    active = 0
    for t in range(40):
        step = s.at(t)
        assert_valid_step(step)
        assert set(step.edges()) <= set(base.edges())
        active += len(step.edges())
        deg = np.array(step.degrees)
        for i, j in step.edges():
            assert step.weight(i, j) == 1.0 / (1 + max(deg[i], deg[j]))
    assert active / (40 * len(base.edges())) == pytest.approx(0.5, abs=0.08)
    assert s.union.edges() == base.edges()


def test_edge_sampling_with_p_one_is_the_base_graph_every_step():
    s = topologies.parse("edge_sampling:ring:8:1")
    assert s.name == "edge_sampling:ring:8:1.0"
    for t in range(4):
        np.testing.assert_array_equal(s.at(t).W, topologies.ring(8).W)


def test_edge_sampling_spec_fields():
    assert topologies.parse("edge_sampling:ring:16:0.5:3").name == "edge_sampling:ring:16:0.5:3"
    # A base with colons of its own: the last field is p unless it is a seed after a p.
    assert topologies.parse(
        "edge_sampling:random_regular:8:3:0.5"
    ).base == topologies.random_regular(8, 3)
    s = topologies.parse("edge_sampling:small_world:12:4:0.5:3:0.25:7")
    assert s.base == topologies.small_world(12, 4, 0.5, 3) and s.p == 0.25
    assert topologies.parse(s.name) == s
    assert topologies.parse("edge_sampling:ring:0.5", n=8).base == topologies.ring(8)
    a, b = (
        topologies.parse("edge_sampling:ring:16:0.5"),
        topologies.parse("edge_sampling:ring:16:0.5:1"),
    )
    assert a.fingerprint != b.fingerprint
    assert [a.at(t).edges() for t in range(4)] != [b.at(t).edges() for t in range(4)]


# --- cyclic lists --------------------------------------------------------------------------------


def test_cyclic_list_uses_its_members_in_turn():
    s = topologies.parse("cyclic:ring:8,star:8,complete:8")
    assert s.period == 3 and s.name == "cyclic:ring:8,star:8,complete:8"
    assert [s.at(t) for t in range(6)] == [
        topologies.ring(8),
        topologies.star(8),
        topologies.complete(8),
    ] * 2
    assert topologies.cyclic(["ring:8", topologies.star(8), "complete:8"]) == s
    assert sorted(s.union.edges()) == topologies.complete(8).edges()
    assert topologies.parse("cyclic:ring,star", n=6).size == 6
    assert topologies.parse("cyclic:ring:8", weights="uniform").at(0).scheme == "uniform"


def test_cyclic_list_of_disconnected_graphs_with_a_connected_union(tmp_path):
    even, odd = tmp_path / "even.txt", tmp_path / "odd.txt"
    even.write_text("0 1\n2 3\n")
    odd.write_text("1 2\n3 0\n")
    s = topologies.parse(f"cyclic:file:{even},file:{odd}")
    assert s.at(0).edges() == [(0, 1), (2, 3)] and s.at(1).edges() == [(0, 3), (1, 2)]
    assert s.union.edges() == topologies.ring(4).edges()
    assert topologies.product_gap(s) == pytest.approx(1.0)  # 2x2 torus: two matchings average
    with pytest.raises(ValueError, match="not connected"):
        topologies.parse(f"file:{even}")  # a static topology must still be connected


# --- bad schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,kwargs,match",
    [
        ("one_peer_exponential:12", {}, "power of two >= 2, got n=12"),
        ("one_peer_exponential:1", {}, "must be >= 2"),
        ("directed_exponential:1", {}, "must be >= 2"),
        ("matchings:7", {}, "even number of peers"),
        ("edge_sampling:ring:8:0", {}, r"p must be in \(0, 1\], got 0.0"),
        ("edge_sampling:ring:8:1.5", {}, r"p must be in \(0, 1\], got 1.5"),
        ("edge_sampling:ring:8:-0.5", {}, r"p must be in \(0, 1\]"),
        ("edge_sampling:ring:8:nan", {}, r"p must be in \(0, 1\]"),
        ("edge_sampling:ring:8:half", {}, "'half' is not a valid number"),
        (
            "edge_sampling:ring:16:1e-6",
            {},
            r"first 1024 steps \(64 per peer\) has \d+ components.*; raise p",
        ),
        ("edge_sampling:matchings:8:0.5", {}, "sample the edges of a static topology"),
        ("edge_sampling:0.5", {}, "give a base topology and a probability"),
        ("cyclic:ring:8,ring:6", {}, r"same size, got sizes \[6, 8\]"),
        ("cyclic:ring:8,matchings:8", {}, "is a schedule; list static topologies only"),
        ("cyclic:", {}, "no topologies listed"),
        ("one_peer_exponential", {}, "size is missing"),
        ("one_peer_exponential:8:2", {}, "too many fields"),
        ("matchings:8", {"weights": "uniform"}, "weights are fixed"),
        ("one_peer_exponential:16", {"n": 8}, "has 16 nodes but n=8"),
        ("matchings:eight", {}, "'eight' is not a valid integer"),
    ],
)
def test_bad_schedules_are_one_line_errors(spec, kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        topologies.parse(spec, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        "one_peer_exponential:8192",
        "matchings:5000",
        "directed_exponential:5000",
        "edge_sampling:ring:5000:0.5",
    ],
)
def test_oversized_schedules_are_refused_before_allocation(spec):
    with pytest.raises(ValueError, match=f"above the maximum of {topologies.MAX_PEERS}"):
        topologies.parse(spec)
