"""Tests for topologies.generators: the closed-form spectra and the structure of each generator,
and its argument checks."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

import topologies
from tests.topologies._support import assert_valid_mixing


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


# --- bad arguments -------------------------------------------------------------------------------


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
