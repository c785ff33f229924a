"""Tests for topologies.topology: the Topology class (validation of W and of graphs, accessors,
immutability, pickling, fingerprints, the spectral diagnostics and stable gamma range, n = 1, a
static topology as the constant schedule, steps allowed to be disconnected), the size limit checked
before allocation, and that importing the package pulls in neither torch nor matplotlib.
Generators: test_generators.py; weights: test_weights.py; importers: test_importers.py; parse:
test_spec.py; the CLI: test_main.py."""

from __future__ import annotations

import hashlib
import pickle

import networkx as nx
import numpy as np
import pytest

import topologies
from topologies import Topology
from tests.topologies._support import _run


# --- spectra -------------------------------------------------------------------------------------


def test_spectral_gap_and_gamma_match_definitions():
    t = topologies.grid(3, 4)
    lam = np.sort(np.linalg.eigvalsh(t.W))[::-1]
    assert t.spectral_gap == pytest.approx(1 - max(abs(lam[1]), abs(lam[-1])), abs=1e-12)
    mu = 1 - lam[1:]
    assert t.gamma == pytest.approx(2 / (mu.min() + mu.max()), abs=1e-12)
    assert list(t.eigenvalues) == sorted(t.eigenvalues, reverse=True)


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


def test_steps_may_be_disconnected_but_are_otherwise_validated():
    W = np.array([[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    step = Topology(W, require_connected=False)
    assert step.neighbors(2) == ()
    assert pickle.loads(pickle.dumps(step)) == step
    with pytest.raises(ValueError, match="not connected"):
        Topology(W)
    with pytest.raises(ValueError, match="not symmetric"):
        Topology(np.array([[0.5, 0.5], [0.25, 0.75]]), require_connected=False)
    with pytest.raises(ValueError, match="doubly stochastic"):
        Topology(np.array([[0.5, 0.0], [0.0, 1.0]]), require_connected=False)


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


def test_static_topology_is_its_own_constant_schedule():
    ring = topologies.ring(8)
    assert ring.at(0) is ring and ring.at(10**9) is ring
    assert ring.period == 1 and ring.union is ring and not ring.is_directed
    assert ring.neighbors_union(3) == ring.neighbors(3)
    assert topologies.product_gap(ring) == pytest.approx(ring.spectral_gap, abs=1e-12)
    fingerprints = {topologies.parse(s).fingerprint for s in ("cyclic:ring:8", "ring:8")}
    assert len(fingerprints) == 2  # a schedule never shares a fingerprint with a static topology


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
        # n^2 beyond a float (the message's GB raised OverflowError); 2^dim is not computed
        # (hypercube:99999999999 was a 12 GB integer)
        pytest.param("ring:" + "9" * 200, id="ring:9x200"),
        pytest.param("torus:" + "9" * 100 + "x" + "9" * 100, id="torus:9x100x9x100"),
        "hypercube:1000",
    ],
)
def test_oversized_topologies_are_refused_before_allocation(spec):
    with pytest.raises(ValueError, match=f"above the maximum of {topologies.MAX_PEERS}"):
        topologies.parse(spec)


# --- packaging -----------------------------------------------------------------------------------


def test_import_does_not_import_torch_or_matplotlib():
    code = (
        "import sys, topologies; topologies.ring(4).gamma; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    )
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr


def test_what_a_training_run_uses_imports_no_networkx_and_graphs_still_do():
    # networkx costs ~0.2 s of every process's start (each MPI rank, each torchrun worker): it is
    # imported only where a graph is made or read (Topology.graph, from_graph, the random graphs).
    code = (
        "import sys, topologies; "
        "t = topologies.parse('torus:2x4'); t.W; t.neighbors(0); t.gamma; "
        "s = topologies.parse('one_peer_exponential:8'); s.at(3).neighbors(0); "
        "assert 'networkx' not in sys.modules, 'networkx imported'; "
        "g = t.graph; assert sorted(g.edges) == t.edges(); "
        "assert topologies.Topology(g).W.tolist() == t.W.tolist(); "
        "assert topologies.parse('small_world:8:2:0.5').size == 8"
    )
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr
