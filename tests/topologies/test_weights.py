"""Tests for topologies.weights: the weight schemes (metropolis, max_degree, best_constant,
uniform) on random connected graphs and on closed forms, and the unknown-scheme error."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import topologies
from tests.topologies._support import assert_valid_mixing

HYP = settings(max_examples=60, deadline=None)


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
