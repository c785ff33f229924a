"""Tests for topologies.importers: `from_graph` (relabelling, given weights, multigraphs) and
`from_edge_list` (comments, weights, each line's errors, an id typo refused before allocation)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import topologies


# --- from_graph ----------------------------------------------------------------------------------


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


# --- from_edge_list ------------------------------------------------------------------------------


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


def test_edge_list_id_typo_is_refused_before_allocation(tmp_path):
    p = tmp_path / "typo.txt"
    p.write_text("0 1\n1 2\n2 99999999999999\n")
    with pytest.raises(ValueError, match=r"node id 99999999999999 but only 4 distinct nodes"):
        topologies.from_edge_list(p)
