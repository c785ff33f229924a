"""Tests for the topologies package: generators, weights, validation, spectra, parsing and CLI."""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import topologies
from topologies import Topology

REPO = Path(__file__).resolve().parents[2]
HYP = settings(max_examples=60, deadline=None)


def assert_valid_mixing(t: Topology) -> None:
    """The invariants every topology must satisfy, checked from scratch."""
    W = t.W
    assert W.dtype == np.float64 and W.shape == (t.size, t.size)
    np.testing.assert_allclose(W, W.T, atol=1e-12)
    np.testing.assert_allclose(W.sum(axis=0), 1.0, atol=1e-9)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-9)
    off = W - np.diag(np.diag(W))
    assert off.min() >= 0
    lam = np.linalg.eigvalsh(W)
    assert lam.max() == pytest.approx(1.0, abs=1e-9)
    assert lam.min() >= -1 - 1e-9
    for i in range(t.size):
        assert t.neighbors(i) == tuple(j for j in range(t.size) if j != i and W[i, j] > 0)


# --- hypothesis strategies -----------------------------------------------------------------------


@st.composite
def connected_graphs(draw, max_nodes: int = 12) -> nx.Graph:
    """A random connected graph: a random spanning tree plus a random set of extra edges."""
    n = draw(st.integers(1, max_nodes))
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for i in range(1, n):
        g.add_edge(i, draw(st.integers(0, i - 1)))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if pairs:
        g.add_edges_from(draw(st.lists(st.sampled_from(pairs), max_size=2 * n)))
    return g


# --- closed forms --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 4, 5, 8, 11])
def test_ring_eigenvalues_closed_form(n):
    t = topologies.ring(n, weights="uniform")
    expected = 1 / 3 + 2 / 3 * np.cos(2 * np.pi * np.arange(n) / n)
    np.testing.assert_allclose(np.sort(t.eigenvalues), np.sort(expected), atol=1e-12)
    # Every node of a ring has degree 2, so metropolis weights are the uniform 1/3 as well.
    np.testing.assert_array_equal(topologies.ring(n).W, t.W)


def test_ring8_gamma_matches_paper():
    assert topologies.ring(8, weights="uniform").gamma == pytest.approx(1.3084, abs=1e-3)
    assert topologies.ring(8).gamma == pytest.approx(1.3084, abs=1e-3)
    # Closed form: μ_min = 2/3 (1 − cos(π/4)), μ_max = 4/3.
    mu_min = 2 / 3 * (1 - math.cos(math.pi / 4))
    assert topologies.ring(8).gamma == pytest.approx(2 / (mu_min + 4 / 3), rel=1e-12)


@pytest.mark.parametrize("a,b", [(3, 3), (3, 5), (4, 4), (4, 6)])
def test_torus_eigenvalues_and_degrees(a, b):
    t = topologies.torus(a, b, weights="uniform")
    assert t.degrees == (4,) * (a * b)
    ka, kb = np.meshgrid(np.arange(a), np.arange(b), indexing="ij")
    expected = 1 / 5 + 2 / 5 * (np.cos(2 * np.pi * ka / a) + np.cos(2 * np.pi * kb / b))
    np.testing.assert_allclose(np.sort(t.eigenvalues), np.sort(expected.ravel()), atol=1e-12)


@pytest.mark.parametrize("dim", [1, 2, 3, 4])
def test_hypercube_eigenvalues(dim):
    t = topologies.hypercube(dim, weights="uniform")
    expected = [1 - 2 * k / (dim + 1) for k in range(dim + 1) for _ in range(math.comb(dim, k))]
    np.testing.assert_allclose(np.sort(t.eigenvalues), np.sort(expected), atol=1e-12)
    assert t.degrees == (dim,) * 2**dim


@pytest.mark.parametrize("n", [2, 3, 8, 13])
def test_complete_graph_mixes_in_one_step(n):
    t = topologies.complete(n)
    np.testing.assert_allclose(t.W, np.full((n, n), 1 / n), atol=1e-15)
    assert t.spectral_gap == pytest.approx(1.0, abs=1e-12)
    assert t.gamma == pytest.approx(1.0, abs=1e-12)


def test_spectral_gap_and_gamma_match_definitions():
    t = topologies.grid(3, 4)
    lam = np.sort(np.linalg.eigvalsh(t.W))[::-1]
    assert t.spectral_gap == pytest.approx(1 - max(abs(lam[1]), abs(lam[-1])), abs=1e-12)
    mu = 1 - lam[1:]
    assert t.gamma == pytest.approx(2 / (mu.min() + mu.max()), abs=1e-12)
    assert list(t.eigenvalues) == sorted(t.eigenvalues, reverse=True)


# --- structure of the generators -----------------------------------------------------------------


@pytest.mark.parametrize(
    "dims,degree",
    [((2, 4), 3), ((2, 2, 2), 3), ((4, 4), 4), ((3, 3, 3), 6), ((2, 2), 2), ((1, 5), 2), ((2,), 1)],
)
def test_torus_degrees(dims, degree):
    t = topologies.torus(*dims)
    assert t.degrees == (degree,) * math.prod(dims)
    assert_valid_mixing(t)


def test_torus_size_one_dimension_is_a_ring():
    np.testing.assert_array_equal(topologies.torus(1, 5).W, topologies.ring(5).W)
    np.testing.assert_array_equal(topologies.torus(5).W, topologies.ring(5).W)
    assert topologies.torus((4, 4)).name == "torus:4x4"  # one sequence argument works too


def test_torus_neighbours_row_major():
    t = topologies.torus(4, 4)
    assert t.neighbors(0) == (1, 3, 4, 12)
    assert t.neighbors(5) == (1, 4, 6, 9)


def test_grid_is_not_periodic():
    t = topologies.grid(3, 4)
    assert len(t.edges()) == 3 * 3 + 2 * 4
    assert t.neighbors(0) == (1, 4)
    assert sorted(set(t.degrees)) == [2, 3, 4]
    assert topologies.grid(5).edges() == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_ring_two_is_a_single_edge():
    t = topologies.ring(2)
    assert t.edges() == [(0, 1)]
    np.testing.assert_array_equal(t.W, [[0.5, 0.5], [0.5, 0.5]])


def test_exponential_star_hypercube_neighbours():
    t = topologies.exponential(8)
    assert t.neighbors(0) == (1, 2, 4, 6, 7)
    assert t.degrees == (5,) * 8
    assert topologies.exponential(2).edges() == [(0, 1)]
    assert topologies.exponential(5).neighbors(0) == (
        1,
        2,
        3,
        4,
    )  # offsets 1, 2, 4; ±4 ≡ ∓1 (mod 5)
    s = topologies.star(5)
    assert s.neighbors(0) == (1, 2, 3, 4) and s.neighbors(3) == (0,)
    assert topologies.hypercube(3).neighbors(5) == (1, 4, 7)


def test_random_regular_is_connected_regular_and_deterministic():
    t = topologies.random_regular(12, 3, seed=4)
    assert t.degrees == (3,) * 12
    assert nx.is_connected(t.graph)
    np.testing.assert_array_equal(t.W, topologies.random_regular(12, 3, seed=4).W)
    assert topologies.random_regular(12, 2, seed=1).degrees == (2,) * 12  # retried until one cycle
    assert any(
        topologies.random_regular(12, 3, seed=s).fingerprint != t.fingerprint for s in range(5)
    )
    for bad in [(5, 3), (4, 4), (6, 1), (3, 0)]:
        with pytest.raises(ValueError):
            topologies.random_regular(*bad)


def test_small_world_is_connected_and_deterministic():
    t = topologies.small_world(16, 4, 0.2, seed=3)
    assert nx.is_connected(t.graph) and t.size == 16
    np.testing.assert_array_equal(t.W, topologies.small_world(16, 4, 0.2, seed=3).W)
    # p = 0 is the ring lattice with k/2 neighbours each side.
    assert topologies.small_world(10, 4, 0.0).degrees == (4,) * 10
    with pytest.raises(ValueError, match="p must be in"):
        topologies.small_world(10, 4, 1.5)


# --- weights -------------------------------------------------------------------------------------


@HYP
@given(connected_graphs(), st.sampled_from(["metropolis", "max_degree", "best_constant"]))
def test_weights_are_symmetric_doubly_stochastic_on_connected_graphs(g, scheme):
    t = topologies.from_graph(g, weights=scheme)
    assert_valid_mixing(t)
    assert set(t.edges()) == {(min(u, v), max(u, v)) for u, v in g.edges() if u != v}
    assert 0 < t.spectral_gap <= 1 + 1e-12


@HYP
@given(connected_graphs())
def test_metropolis_weights_formula(g):
    t = topologies.from_graph(g)
    deg = dict(g.degree())
    for i, j in g.edges():
        assert t.weight(i, j) == pytest.approx(1 / (1 + max(deg[i], deg[j])))
    assert np.diag(t.W).min() > 0  # metropolis keeps a positive self-weight


@HYP
@given(connected_graphs())
def test_best_constant_gamma_is_one(g):
    # W = I − αL puts the non-zero spectrum of I − W symmetric around 1, so γ = 1 is already optimal.
    t = topologies.from_graph(g, weights="best_constant")
    assert t.gamma == pytest.approx(1.0, abs=1e-9)
    assert_valid_mixing(t)


def test_best_constant_may_have_negative_diagonal():
    t = topologies.star(6, weights="best_constant")
    assert t.W[0, 0] < 0  # the hub: 1 − α·5 with α = 2/(1 + 6)
    assert t.weight(0, 1) == pytest.approx(2 / 7)
    assert_valid_mixing(t)
    assert t.spectral_gap > topologies.star(6).spectral_gap


def test_max_degree_weights():
    t = topologies.star(5, weights="max_degree")
    assert t.weight(0, 3) == pytest.approx(1 / 5)
    assert t.weight(3, 3) == pytest.approx(4 / 5)


def test_uniform_on_irregular_graph_is_rejected():
    with pytest.raises(ValueError, match="regular graphs.*metropolis"):
        topologies.star(4, weights="uniform")


@pytest.mark.parametrize(
    "build",
    [
        lambda: topologies.ring(4, weights="bogus"),
        lambda: topologies.torus(3, 3, weights="bogus"),
        lambda: topologies.from_graph(nx.path_graph(3), weights="bogus"),
        lambda: topologies.parse("ring:4", weights="bogus"),
        lambda: topologies.weight_matrix(np.ones((2, 2)) - np.eye(2), "bogus"),
    ],
)
def test_unknown_weights_scheme(build):
    with pytest.raises(ValueError, match="unknown weights scheme 'bogus'; valid: metropolis"):
        build()


# --- validation ----------------------------------------------------------------------------------


def test_disconnected_graph_is_rejected():
    g = nx.Graph([(0, 1), (2, 3)])
    with pytest.raises(ValueError, match="graph is not connected: 2 components"):
        topologies.from_graph(g)
    half = np.full((2, 2), 0.5)
    W = np.block([[half, np.zeros((2, 2))], [np.zeros((2, 2)), half]])
    with pytest.raises(ValueError, match="graph is not connected: 2 components"):
        Topology(W)
    with pytest.raises(ValueError, match="not connected: 3 components"):
        Topology(np.eye(3))


def test_asymmetric_matrix_is_rejected_naming_the_pair():
    W = np.array([[0.5, 0.3, 0.2], [0.3, 0.3, 0.4], [0.0, 0.4, 0.6]])
    with pytest.raises(ValueError, match=r"not symmetric: W\[0,2\] = 0\.2 but W\[2,0\] = 0\.0"):
        Topology(W)


def test_not_doubly_stochastic_is_rejected_naming_the_row():
    W = np.array([[0.5, 0.5, 0.0], [0.5, 0.2, 0.2], [0.0, 0.2, 0.8]])
    with pytest.raises(ValueError, match=r"not doubly stochastic: row 1 sums to 0\.9"):
        Topology(W)


def test_negative_weights_are_rejected():
    W = np.array([[1.1, -0.1], [-0.1, 1.1]])
    with pytest.raises(ValueError, match=r"negative edge weight W\[0,1\]"):
        Topology(W)
    # A negative diagonal is allowed only while no eigenvalue drops below −1.
    with pytest.raises(ValueError, match="eigenvalue .* < -1"):
        Topology(np.array([[-0.5, 1.5], [1.5, -0.5]]))


@pytest.mark.parametrize(
    "W,match",
    [
        (np.ones((2, 3)) / 3, "square"),
        (np.zeros((0, 0)), "at least one node"),
        (np.array([[np.nan, 1], [1, 0]]), "non-finite"),
        ([["a", "b"], ["c", "d"]], "numeric"),
        (np.full((2, 2), 0.5 + 0j), "complex"),
    ],
)
def test_malformed_matrices_are_rejected(W, match):
    with pytest.raises(ValueError, match=match):
        Topology(W)


def test_graph_with_bad_node_labels_is_rejected():
    g = nx.Graph()
    g.add_edge(1, 2, weight=0.5)
    with pytest.raises(ValueError, match=r"nodes must be the integers 0\.\.1.*from_graph"):
        Topology(g)
    g = nx.Graph()
    g.add_edge("a", "b", weight=0.5)
    with pytest.raises(ValueError, match="nodes must be the integers"):
        Topology(g)


def test_weighted_graph_constructor_and_missing_weight():
    g = nx.Graph()
    g.add_edge(0, 1, weight=0.25)
    g.add_edge(1, 2, weight=0.25)
    t = Topology(g, name="two-edges")
    np.testing.assert_allclose(np.diag(t.W), [0.75, 0.5, 0.75])
    assert t.scheme == "given" and t.name == "two-edges"
    g.add_edge(0, 2)
    with pytest.raises(ValueError, match=r"edge \(0, 2\) has no 'weight'"):
        Topology(g)


def test_directed_graph_is_rejected():
    with pytest.raises(ValueError, match="directed"):
        topologies.from_graph(nx.DiGraph([(0, 1)]))


@pytest.mark.parametrize(
    "call",
    [
        lambda: topologies.ring(0),
        lambda: topologies.torus(),
        lambda: topologies.grid(3, 0),
        lambda: topologies.ring(2.5),
    ],
)
def test_bad_generator_arguments(call):
    with pytest.raises(ValueError):
        call()


# --- n = 1 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: topologies.ring(1),
        lambda: topologies.complete(1),
        lambda: topologies.torus(1),
        lambda: topologies.torus(1, 1),
        lambda: topologies.grid(1),
        lambda: topologies.star(1),
        lambda: topologies.hypercube(0),
        lambda: topologies.exponential(1),
        lambda: topologies.random_regular(1, 0),
        lambda: topologies.small_world(1, 0, 0.5),
        lambda: topologies.from_graph(nx.empty_graph(1)),
        lambda: topologies.parse("ring", n=1),
        lambda: Topology([[1.0]]),
    ]
    + [lambda s=s: topologies.ring(1, weights=s) for s in topologies.SCHEMES],
)
def test_single_node(build):
    t = build()
    assert t.size == 1
    np.testing.assert_array_equal(t.W, [[1.0]])
    assert t.neighbors(0) == () and t.edges() == [] and t.degrees == (0,)
    assert t.spectral_gap == 1.0 and t.gamma == 1.0


# --- the Topology object -------------------------------------------------------------------------


def test_topology_accessors():
    t = topologies.torus(3, 3)
    assert t.size == 9 and t.name == "torus:3x3" and t.scheme == "metropolis"
    assert t.weight(0, 1) == pytest.approx(0.2) and t.weight(0, 4) == 0.0
    assert isinstance(t.weight(0, 1), float)
    assert t.edges() == sorted(t.edges()) and all(i < j for i, j in t.edges())
    assert len(t.edges()) == 18
    assert t.graph.edges[0, 1]["weight"] == pytest.approx(0.2)
    assert sorted(t.graph.nodes) == list(range(9))
    assert "torus:3x3" in repr(t) and "size=9" in repr(t)
    with pytest.raises(IndexError):
        t.neighbors(9)
    with pytest.raises(IndexError):
        t.weight(-1, 0)
    assert t.neighbors(np.int64(0)) == t.neighbors(0)


def test_topology_is_immutable():
    t = topologies.ring(5)
    with pytest.raises(ValueError):
        t.W[0, 0] = 2.0
    with pytest.raises(AttributeError):
        t.name = "other"
    with pytest.raises(nx.NetworkXError):
        t.graph.add_edge(0, 2)
    W = np.full((2, 2), 0.5)
    t2 = Topology(W)
    W[0, 0] = 9.0  # the caller's array is copied, not aliased
    assert t2.W[0, 0] == 0.5


def test_pickle_round_trip_keeps_validation_and_read_only():
    t = topologies.star(4, weights="max_degree")
    t2 = pickle.loads(pickle.dumps(t))
    assert t2 == t and t2.scheme == "max_degree" and t2.fingerprint == t.fingerprint
    assert not t2.W.flags.writeable


# --- fingerprint ---------------------------------------------------------------------------------


def test_fingerprint_equal_for_equal_W():
    a, b = topologies.ring(8), topologies.torus(8)  # same matrix, different names
    assert a.name != b.name and a.fingerprint == b.fingerprint
    assert topologies.ring(8, weights="uniform").fingerprint == a.fingerprint
    assert Topology(np.array(a.W)).fingerprint == a.fingerprint
    # On a star the hub's degree dominates every edge, so both schemes give the same W.
    assert topologies.star(8).fingerprint == topologies.star(8, weights="max_degree").fingerprint


def test_fingerprint_differs_for_different_W():
    prints = {
        topologies.ring(8).fingerprint,
        topologies.ring(9).fingerprint,
        topologies.grid(3, 3).fingerprint,
        topologies.grid(3, 3, weights="max_degree").fingerprint,
        topologies.complete(8).fingerprint,
        topologies.exponential(8).fingerprint,
        topologies.hypercube(3).fingerprint,
    }
    assert len(prints) == 7


def test_fingerprint_is_stable():
    # The format is part of the cross-rank (and cross-version) contract; changing it is a break.
    t = topologies.complete(2)
    h = hashlib.sha256(b"topologies.Topology/v1\0")
    h.update((2).to_bytes(8, "little"))
    h.update(np.full((2, 2), 0.5).astype("<f8").tobytes())
    assert t.fingerprint == h.hexdigest()
    assert topologies.ring(4).fingerprint == (
        "daea7d83da4755a34bf19d5f7c76a2843bc66d2bbe3d33b5e562e805cd3be2b9"
    )


# --- from_graph / from_edge_list -----------------------------------------------------------------


def test_from_graph_relabels_sorted_and_ignores_self_loops():
    g = nx.Graph([("c", "a"), ("a", "b"), ("b", "b")])
    t = topologies.from_graph(g)
    assert t.edges() == [(0, 1), (0, 2)]  # a=0, b=1, c=2
    assert t.name == "graph:3"
    mixed = nx.Graph([(1, "x"), ("x", (2, 3))])  # unsortable: insertion order
    assert topologies.from_graph(mixed).edges() == [(0, 1), (1, 2)]


def test_from_graph_given_weights():
    g = nx.Graph()
    g.add_edge(10, 20, weight=0.3)
    g.add_edge(20, 30, weight=0.1)
    t = topologies.from_graph(g, weights="given")
    assert t.weight(0, 1) == pytest.approx(0.3) and t.weight(1, 1) == pytest.approx(0.6)


def test_from_graph_collapses_multigraph():
    t = topologies.from_graph(nx.MultiGraph([(0, 1), (0, 1), (1, 2)]))
    assert t.edges() == [(0, 1), (1, 2)]


def test_edge_list_with_comments_and_weights(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("# a weighted path\n\n0 1 0.25   # first edge\n1 2 0.5\n  \n")
    t = topologies.from_edge_list(p)
    assert t.scheme == "given" and t.name == f"file:{p}"
    assert t.weight(0, 1) == 0.25 and t.weight(1, 2) == 0.5
    np.testing.assert_allclose(np.diag(t.W), [0.75, 0.25, 0.5])
    # Asking for a scheme recomputes the weights from the structure.
    m = topologies.from_edge_list(p, weights="metropolis")
    np.testing.assert_array_equal(m.W, topologies.grid(3).W)


def test_edge_list_unweighted_defaults_to_metropolis(tmp_path):
    p = tmp_path / "ring.txt"
    p.write_text("".join(f"{i} {(i + 1) % 6}\n" for i in range(6)))
    np.testing.assert_array_equal(topologies.from_edge_list(p).W, topologies.ring(6).W)
    single = tmp_path / "one.txt"
    single.write_text("0 0\n")
    assert topologies.from_edge_list(single).size == 1


@pytest.mark.parametrize(
    "text,match",
    [
        ("0 1\n1 2\nfoo bar\n", r"g\.txt:3: cannot parse 'foo bar'"),
        ("0 1\n# c\n\n-1 2\n", r"g\.txt:4: cannot parse"),
        ("0 1 0.5\n1 2 x\n", r"g\.txt:2: cannot parse"),
        ("0 1 2 3\n", r"g\.txt:1: cannot parse"),
        ("0 1 0.5\n1 2\n", r"g\.txt:2: missing edge weight"),
        ("0 1 0.5\n1 0 0.25\n", r"g\.txt:2: edge \(0, 1\) repeats line 1"),
        ("0 1 -0.5\n", r"g\.txt:1: edge weight -0.5 must be finite and >= 0"),
        ("0 1\n1 3\n", r"node ids must be 0\.\.3 .*\[2\] is missing"),
        ("# nothing\n", "no edges"),
        ("0 1\n2 3\n", "not connected: 2 components"),
        ("0 1 0.7\n1 2 0.7\n", r"eigenvalue -1\.1 < -1 \(negative diagonal, e\.g\. W\[1,1\]"),
    ],
)
def test_edge_list_errors(tmp_path, text, match):
    p = tmp_path / "g.txt"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        topologies.from_edge_list(p)


def test_edge_list_given_without_weights(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("0 1\n")
    with pytest.raises(ValueError, match="carry no weights"):
        topologies.from_edge_list(p, weights="given")


# --- parse ---------------------------------------------------------------------------------------

SPECS = [
    "ring:8",
    "ring:1",
    "ring:2",
    "torus:4x4",
    "torus:2x2x2",
    "torus:3x5",
    "grid:4x4",
    "grid:2x3x2",
    "complete:8",
    "star:8",
    "hypercube:3",
    "exponential:8",
    "random_regular:8:3",
    "random_regular:10:4:7",
    "small_world:16:4:0.2",
    "small_world:12:4:0.5:3",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("scheme", [None, "max_degree", "best_constant"])
def test_parse_round_trips(spec, scheme):
    t = topologies.parse(spec, weights=scheme)
    assert t.name == spec
    assert t.scheme == (scheme or "metropolis")
    again = topologies.parse(t.name, n=t.size, weights=scheme)
    assert again == t and again.fingerprint == t.fingerprint
    assert_valid_mixing(t)


def test_parse_matches_generators():
    assert topologies.parse("torus:4x4") == topologies.torus(4, 4)
    assert topologies.parse("ring", n=8) == topologies.ring(8)
    assert topologies.parse(" Ring:8 ") == topologies.ring(8)
    assert topologies.parse("random-regular:8:3") == topologies.random_regular(8, 3)
    assert topologies.parse("random_regular:3", n=8) == topologies.random_regular(8, 3)
    assert topologies.parse("small_world:4:0.2", n=16) == topologies.small_world(16, 4, 0.2)
    assert topologies.parse("hypercube", n=8) == topologies.hypercube(3)
    assert topologies.parse("torus", n=16).name == "torus:4x4"
    assert topologies.parse("grid", n=8).name == "grid:2x4"
    assert topologies.parse("ring:8", weights="uniform").scheme == "uniform"
    t = topologies.ring(4)
    assert topologies.parse(t, n=4) is t


def test_parse_file_spec(tmp_path):
    p = tmp_path / "edges.txt"
    p.write_text("0 1\n1 2\n2 0\n")
    t = topologies.parse(f"file:{p}")
    assert t.name == f"file:{p}" and t == topologies.parse(t.name)
    np.testing.assert_array_equal(t.W, topologies.ring(3).W)


@pytest.mark.parametrize(
    "spec,kwargs,match",
    [
        (
            "moebius:8",
            {},
            r"^topology spec 'moebius:8': unknown name 'moebius'; valid: ring, torus, grid",
        ),
        ("", {}, "topology spec '': unknown name ''"),
        ("ring", {}, "size is missing"),
        ("ring:eight", {}, "'eight' is not a valid integer"),
        ("ring:8:2", {}, "too many fields"),
        ("torus:4x", {}, "not a valid integer"),
        ("hypercube", {"n": 6}, "not a power of two"),
        ("small_world:16:4", {}, "size is missing"),
        ("random_regular:1:2:3:4", {}, "wrong number of fields"),
        ("ring:8", {"n": 4}, "has 8 nodes but n=4"),
        ("file:", {}, "missing path"),
    ],
)
def test_parse_errors(spec, kwargs, match):
    with pytest.raises(ValueError, match=match):
        topologies.parse(spec, **kwargs)


# --- packaging and CLI ---------------------------------------------------------------------------


def _run(*args):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )


def test_import_does_not_import_torch_or_matplotlib():
    code = (
        "import sys, topologies; topologies.ring(4).gamma; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    )
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr


def test_cli_show_prints_summary_and_writes_png(tmp_path):
    png = tmp_path / "torus.png"
    r = _run("-m", "topologies", "show", "torus:4x4", "--png", str(png))
    assert r.returncode == 0, r.stderr
    assert "spectral gap 0.4" in r.stdout
    assert "size         16" in r.stdout and "degrees      4" in r.stdout
    assert topologies.torus(4, 4).fingerprint in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["torus.png"]  # no temp file left behind


def test_cli_bad_spec_is_one_line_exit_2():
    r = _run("-m", "topologies", "show", "moebius:8")
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "topology spec 'moebius:8': unknown name 'moebius'" in r.stderr


def test_cli_in_process(capsys, tmp_path):
    from topologies.__main__ import main

    assert main(["show", "ring", "-n", "8", "--weights", "uniform"]) == 0
    out = capsys.readouterr().out
    assert "gamma        1.30839" in out and "weights      uniform" in out
    assert main(["show", "star:5", "--weights", "uniform"]) == 2
    assert "use weights='metropolis'" in capsys.readouterr().err
    assert main(["show", f"file:{tmp_path / 'missing.txt'}"]) == 2
    assert "No such file" in capsys.readouterr().err


# --- sizes are checked before anything of that size is allocated ---------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "hypercube:40",
        "ring:100000",
        "torus:100x100",
        "complete:5000",
        "star:4097",
        "exponential:10000",
        "random_regular:5000:3",
    ],
)
def test_oversized_topologies_are_refused_before_allocation(spec):
    with pytest.raises(ValueError, match=f"above the maximum of {topologies.MAX_PEERS}"):
        topologies.parse(spec)


def test_edge_list_id_typo_is_refused_before_allocation(tmp_path):
    p = tmp_path / "typo.txt"
    p.write_text("0 1\n1 2\n2 99999999999999\n")
    with pytest.raises(ValueError, match=r"node id 99999999999999 but only 4 distinct nodes"):
        topologies.from_edge_list(p)


def test_stable_gamma_range_closed_forms():
    # ring:4 with metropolis weights 1/3: I - W has eigenvalues 0, 1/3, 1/3, 4/3 -> gamma < 1.5.
    ring4 = topologies.ring(4)
    assert ring4.gamma_stable_max == pytest.approx(1.5)
    ring4.check_gamma(1.4)
    with pytest.raises(ValueError, match=r"outside the stable range \(0, 1.5\) of ring:4"):
        ring4.check_gamma(3.0)
    with pytest.raises(ValueError, match="stable range"):
        ring4.check_gamma(0.0)
    # complete graph, W = 11^T/n: every non-zero eigenvalue of I - W is 1 -> gamma < 2.
    assert topologies.complete(8).gamma_stable_max == pytest.approx(2.0)
    assert topologies.ring(1).gamma_stable_max == float("inf")
    # The topology's own gamma is always inside the range.
    for spec in ("ring:8", "torus:4x4", "star:6", "exponential:16"):
        t = topologies.parse(spec)
        t.check_gamma(t.gamma)
