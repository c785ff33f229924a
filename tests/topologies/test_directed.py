"""Tests for topologies.directed: directed_exponential, directed edge lists with push weights,
column-stochastic validation, and the fingerprints of directed graphs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import topologies
from topologies import DirectedSchedule, DirectedTopology, Schedule, Topology
from topologies.directed import cycle_period
from tests.topologies._support import product


# --- directed graphs -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 8, 16])
def test_directed_exponential_averages_exactly_in_log2_n_steps(n):
    s = topologies.parse(f"directed_exponential:{n}")
    assert isinstance(s, DirectedSchedule) and s.is_directed and not isinstance(s, Schedule)
    log2n = n.bit_length() - 1
    assert s.period == log2n
    np.testing.assert_allclose(product(s, log2n), np.full((n, n), 1.0 / n), atol=1e-15)
    assert topologies.product_gap(s) == pytest.approx(1.0, abs=1e-12)
    for t in range(log2n):
        step = s.at(t)
        np.testing.assert_allclose(step.P.sum(axis=0), 1.0)
        for i in range(n):
            assert step.out_neighbors(i) == (((i + (1 << t)) % n),)
            assert step.in_neighbors(i) == (((i - (1 << t)) % n),)


def test_directed_exponential_on_any_size_is_strongly_connected_column_stochastic():
    s = topologies.directed_exponential(6)
    assert s.period == 3 and s.union.out_degrees == (3,) * 6
    for t in range(3):
        np.testing.assert_allclose(s.at(t).P.sum(axis=0), 1.0)
    assert 0 < topologies.product_gap(s) < 1


def test_directed_edge_list_has_uniform_push_weights(tmp_path):
    path = tmp_path / "cycle.txt"
    path.write_text("# i sends to j\n0 1\n0 2\n1 2\n2 0\n")
    d = topologies.from_directed_edge_list(path)
    assert d == topologies.parse(f"directed_file:{path}") and d.is_directed
    assert not isinstance(d, Topology) and d.at(3) is d and d.union is d and d.period == 1
    assert d.out_neighbors(0) == (1, 2) and d.in_neighbors(2) == (0, 1)
    assert d.edges() == [(0, 1), (0, 2), (1, 2), (2, 0)]
    expected = np.array([[1 / 3, 0, 1 / 2], [1 / 3, 1 / 2, 0], [1 / 3, 1 / 2, 1 / 2]])
    np.testing.assert_allclose(d.P, expected)
    assert pickle.loads(pickle.dumps(d)) == d


def test_bad_directed_graphs_are_one_line_errors(tmp_path):
    one_way = tmp_path / "one_way.txt"
    one_way.write_text("0 1\n1 2\n")
    with pytest.raises(ValueError, match="not strongly connected: 3 strong components"):
        topologies.from_directed_edge_list(one_way)
    garbled = tmp_path / "garbled.txt"
    garbled.write_text("0 1\n1 x\n")
    with pytest.raises(ValueError, match=r"garbled.txt:2: cannot parse '1 x'"):
        topologies.from_directed_edge_list(garbled)
    with pytest.raises(ValueError, match="not column-stochastic: column 1"):
        DirectedTopology(np.array([[0.5, 0.5], [0.5, 0.6]]))
    with pytest.raises(ValueError, match="negative weight"):
        DirectedTopology(np.array([[1.5, 0.5], [-0.5, 0.5]]))
    with pytest.raises(ValueError, match="weights are fixed"):
        topologies.parse(f"directed_file:{one_way}", weights="uniform")


def test_a_periodic_push_matrix_is_refused_and_one_self_weight_makes_it_aperiodic():
    """A rotation (every peer hands its whole pair to the next) is column-stochastic and strongly
    connected, but its pairs circulate for ever: push-sum never reached consensus on it."""
    rotation = np.roll(np.eye(4), 1, axis=0)  # P[i+1, i] = 1
    with pytest.raises(ValueError, match="P is periodic.* multiple of 4.*P\\[i,i\\]") as info:
        DirectedTopology(rotation)
    assert "\n" not in str(info.value)
    kept = rotation.copy()
    kept[:, 0] = 0.0
    kept[0, 0] = kept[1, 0] = 0.5  # peer 0 keeps half: cycles of lengths 1 and 4, gcd 1
    assert DirectedTopology(kept).spectral_gap > 0
    # cycles of lengths 2 and 4 (0 <-> 1, 0 -> 1 -> 2 -> 3 -> 0): period 2; with 3 and 2: 1
    two_and_four = np.zeros((4, 4), dtype=bool)
    for src, dst in [(0, 1), (1, 0), (1, 2), (2, 3), (3, 0)]:
        two_and_four[dst, src] = True
    assert cycle_period(two_and_four) == 2
    two_and_four[0, 2] = True  # 2 -> 0: a cycle 0 -> 1 -> 2 -> 0 of length 3
    assert cycle_period(two_and_four) == 1


def test_directed_and_undirected_fingerprints_differ():
    ring = topologies.ring(2)  # W = [[.5, .5], [.5, .5]] is column-stochastic too
    as_directed = DirectedTopology(ring.W)
    np.testing.assert_array_equal(as_directed.P, ring.W)
    assert as_directed.fingerprint != ring.fingerprint
    assert as_directed != ring and as_directed.is_directed and not ring.is_directed
