"""Topology repair after peers leave: each kind's stated rule, valid weights, γ of the new graph."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import topologies
from topologies.repair import REBUILT_KINDS
from topologies.topology import count_components


def live_graph(repaired):
    """The live peers' graph of a static repair, as its edge set, and the absent rows of W."""
    return set(repaired.static.edges())


def test_ring_minus_one_is_the_ring_of_the_survivors_in_cyclic_order():
    repaired = topologies.repair(topologies.ring(8), [0, 1, 2, 4, 5, 6, 7])
    assert live_graph(repaired) == {(0, 1), (1, 2), (2, 4), (4, 5), (5, 6), (6, 7), (0, 7)}
    # the same mixing matrix as ring:7 on the survivors, and its consensus step
    live = [0, 1, 2, 4, 5, 6, 7]
    assert np.array_equal(repaired.static.W[np.ix_(live, live)], topologies.ring(7).W)
    assert repaired.gamma == pytest.approx(topologies.ring(7).gamma, rel=1e-12)
    # the absent peer is isolated: no edge, W[3, 3] = 1
    assert repaired.static.neighbors(3) == () and repaired.static.W[3, 3] == 1.0


def test_rebuilt_kinds_are_the_spec_on_the_survivors():
    live = [0, 2, 3, 5, 6, 7]
    for kind, spec in (("complete", "complete:8"), ("exponential", "exponential:8")):
        repaired = topologies.repair(topologies.parse(spec), live)
        rebuilt = topologies.parse(f"{kind}:6")
        assert np.array_equal(repaired.static.W[np.ix_(live, live)], rebuilt.W), kind
    # star: the hub stays, or the smallest live id takes its place
    assert live_graph(topologies.repair(topologies.star(6), [0, 2, 5])) == {(0, 2), (0, 5)}
    assert live_graph(topologies.repair(topologies.star(6), [1, 2, 5])) == {(1, 2), (1, 5)}


@pytest.mark.parametrize("spec", ["torus:4x4", "grid:3x4", "hypercube:4", "random_regular:12:3"])
def test_bridged_kinds_keep_every_surviving_edge_and_link_the_departed_neighbourhood(spec):
    topology = topologies.parse(spec)
    rng = np.random.default_rng(0)
    for _ in range(20):
        gone = set(rng.choice(topology.size, size=rng.integers(1, 4), replace=False).tolist())
        live = [k for k in range(topology.size) if k not in gone]
        try:
            repaired = topologies.repair(topology, live)
        except ValueError as exc:  # only when nothing can reconnect them: never on these graphs
            pytest.fail(str(exc))
        edges = live_graph(repaired)
        survivors = {(i, j) for i, j in topology.edges() if i not in gone and j not in gone}
        assert survivors <= edges
        # every added edge joins two live neighbours of the departed peers
        touching = {j for d in gone for j in topology.neighbors(d)} - gone
        assert all(i in touching and j in touching for i, j in edges - survivors)
        assert all(repaired.static.neighbors(d) == () for d in gone)


def test_a_departed_group_is_bridged_as_one():
    """Two adjacent departed peers of the 4x4 torus: their six live neighbours in one ring."""
    topology = topologies.torus(4, 4)
    live = [k for k in range(16) if k not in (5, 6)]
    repaired = topologies.repair(topology, live)
    around = sorted({j for d in (5, 6) for j in topology.neighbors(d)} - {5, 6})
    added = live_graph(repaired) - set(topology.edges())
    ring = {tuple(sorted(p)) for p in zip(around, around[1:] + around[:1])}
    assert added == ring - set(topology.edges())


@pytest.mark.parametrize("weights", ["metropolis", "max_degree", "best_constant", "uniform"])
def test_weights_keep_the_topologys_scheme_where_it_is_valid(weights):
    ring = topologies.ring(8, weights=weights)
    repaired = topologies.repair(ring, [0, 1, 2, 4, 5, 6, 7])
    assert repaired.static.scheme == weights  # the survivors' ring is still regular
    torus = topologies.torus(4, 4, weights=weights)
    bridged = topologies.repair(torus, [k for k in range(16) if k != 5])
    # uniform (1/(deg+1)) is only doubly stochastic on regular graphs: Metropolis instead
    assert bridged.static.scheme == ("metropolis" if weights == "uniform" else weights)
    w = bridged.static.W
    assert np.allclose(w, w.T, atol=0) and np.allclose(w.sum(axis=1), 1.0, atol=1e-12)


def test_gamma_is_rechecked_on_the_repaired_graph():
    repaired = topologies.repair(topologies.ring(8), [0, 1, 2, 4, 5, 6, 7])
    top = repaired.gamma_stable_max
    assert top == pytest.approx(topologies.ring(7).gamma_stable_max, rel=1e-12)
    repaired.check_gamma(0.99 * top)
    with pytest.raises(ValueError, match="outside the stable range"):
        repaired.check_gamma(1.01 * top)


def test_everyone_back_is_the_original_graph():
    for spec in ("ring:8", "torus:4x4", "exponential:16", "star:5"):
        topology = topologies.parse(spec)
        repaired = topologies.repair(topology, range(topology.size))
        assert np.array_equal(repaired.static.W, topology.W), spec


@pytest.mark.parametrize(
    "spec", ["one_peer_exponential:16", "matchings:16", "edge_sampling:ring:16:0.5"]
)
def test_schedules_keep_their_steps_within_the_live_peers_and_a_connected_union(spec):
    schedule = topologies.parse(spec)
    for gone in ({3}, {3, 7, 11}, set(range(1, 16, 2))):
        live = [k for k in range(16) if k not in gone]
        repaired = topologies.repair(schedule, live)
        union = set(repaired.union.edges())
        for t in range(40):
            step = set(repaired.at(t).edges())
            assert step <= union  # per-edge state sized by the union never misses an edge
            assert all(i not in gone and j not in gone for i, j in step)
        assert all(repaired.union.neighbors(d) == () for d in gone)
        if spec.startswith("matchings"):
            assert len(union) == len(live) * (len(live) - 1) // 2
        # deterministic: the same graph on every peer
        assert np.array_equal(topologies.repair(schedule, live).at(5).W, repaired.at(5).W)


def test_one_peer_exponential_on_survivors_pairs_positions():
    repaired = topologies.repair(topologies.parse("one_peer_exponential:8"), [0, 1, 2, 4, 5, 6, 7])
    assert repaired.period == 3  # ceil(log2 7)
    # positions 0..6 = peers 0,1,2,4,5,6,7; step 0 pairs positions p, p XOR 1
    assert set(repaired.at(0).edges()) == {(0, 1), (2, 4), (5, 6)}
    assert set(repaired.at(2).edges()) == {(0, 5), (1, 6), (2, 7)}


def test_cyclic_members_are_repaired_by_their_own_rules():
    schedule = topologies.parse("cyclic:ring:8,star:8")
    repaired = topologies.repair(schedule, [1, 2, 3, 4, 5, 6, 7])
    assert set(repaired.at(0).edges()) == set(
        topologies.repair(topologies.ring(8), range(1, 8)).static.edges()
    )
    assert set(repaired.at(1).edges()) == {(1, k) for k in range(2, 8)}  # a new hub


def test_bad_repairs_are_refused_in_one_line():
    ring = topologies.ring(8)
    with pytest.raises(ValueError, match="no live peer left"):
        topologies.repair(ring, [])
    with pytest.raises(ValueError, match="peer 9 is not a peer of 'ring:8'"):
        topologies.repair(ring, [0, 9])
    with pytest.raises(ValueError, match="is directed: peers cannot leave or join"):
        topologies.repair(topologies.parse("directed_exponential:8"), range(7))
    with pytest.raises(ValueError) as info:
        topologies.repair(ring, [])
    assert "\n" not in str(info.value)


def test_every_kind_has_a_rule_and_stays_connected():
    """Every static kind of the spec grammar, minus each single peer and each pair."""
    specs = [
        "ring:6",
        "complete:6",
        "star:6",
        "exponential:6",
        "torus:2x3",
        "grid:2x3",
        "hypercube:3",
        "random_regular:6:3",
        "small_world:6:2:0.5",
    ]
    for spec in specs:
        topology = topologies.parse(spec)
        kind = spec.split(":")[0]
        for gone in itertools.chain(
            itertools.combinations(range(topology.size), 1),
            itertools.combinations(range(topology.size), 2),
        ):
            live = [k for k in range(topology.size) if k not in gone]
            w = topologies.repair(topology, live).static.W[np.ix_(live, live)]
            assert count_components(w > 0) == 1, (spec, gone)
            if kind not in REBUILT_KINDS:  # bridged: every surviving edge kept
                kept = {(i, j) for i, j in topology.edges() if i in live and j in live}
                assert kept <= set(topologies.repair(topology, live).static.edges())
