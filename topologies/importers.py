"""Topologies from a graph of the user's: a networkx graph (`from_graph`) or an edge-list file
(`from_edge_list`), with the nodes renumbered 0..n-1 and each line of a file checked.

Both return a validated :class:`~topologies.Topology`; `generators.py` re-exports them, and its spec
parser spells a file as ``file:PATH``.
"""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING

import numpy as np

from .topology import (
    MAX_PEERS,
    Topology,
    _check_graph_input,
    _matrix_from_weighted_graph,
    check_connected,
    check_size,
)
from .weights import check_scheme, weight_matrix

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["from_graph", "from_edge_list", "node_count"]


def from_graph(
    g: nx.Graph,
    weights: str = "metropolis",
    *,
    name: str | None = None,
    require_connected: bool = True,
) -> Topology:
    """Topology of any undirected networkx graph.

    Nodes are relabelled 0..n-1 in sorted order (insertion order if the labels do not sort);
    self-loops are ignored. ``weights`` is a scheme from :data:`topologies.SCHEMES`, or ``"given"``
    to use each edge's ``"weight"`` attribute with the diagonal set to 1 − row sum.
    A multigraph's parallel edges are collapsed (not allowed with ``"given"``).
    ``require_connected=False`` accepts a disconnected graph, for one member of a cyclic schedule.
    """
    import networkx as nx

    if not isinstance(g, nx.Graph):
        raise TypeError(f"from_graph needs a networkx.Graph, got {type(g).__name__}")
    check_scheme(weights, extra=("given",))
    if g.is_multigraph() and not g.is_directed():
        if weights == "given":
            raise ValueError(
                "multigraph given with weights='given': parallel edges make W ambiguous"
            )
        g = nx.Graph(g)
    _check_graph_input(g)

    nodes = list(g.nodes)
    try:
        nodes = sorted(nodes)
    except TypeError:
        pass  # mixed or unorderable labels: keep the graph's own order
    index = {v: i for i, v in enumerate(nodes)}
    n = len(nodes)
    adj = np.zeros((n, n), dtype=bool)
    for u, v in g.edges():
        if u != v:
            adj[index[u], index[v]] = adj[index[v], index[u]] = True
    if require_connected:
        check_connected(adj)

    w = _matrix_from_weighted_graph(g, nodes) if weights == "given" else weight_matrix(adj, weights)
    return Topology(
        w,
        name=name if name is not None else f"graph:{n}",
        scheme=weights,
        require_connected=require_connected,
    )


_EDGE_LINE = re.compile(r"^\s*(\d+)\s+(\d+)(?:\s+(\S+))?\s*$", re.ASCII)


def node_count(path: str, nodes: set[int]) -> int:
    """n for an edge-list file whose node ids are ``nodes``: they must be exactly 0..n-1.

    Ids are checked against the number of distinct nodes before anything of size max(id) exists:
    a typo like 99999999999999 must not allocate a range or a matrix of that size.
    """
    if not nodes:
        raise ValueError(
            f"{path}: no edges found; write one 'i j' per line (or '0 0' for one node)"
        )
    largest = max(nodes)
    if largest >= len(nodes) and largest >= MAX_PEERS:
        raise ValueError(
            f"{path}: node id {largest} but only {len(nodes)} distinct nodes; node ids must be "
            f"0..{len(nodes) - 1} (renumber the nodes, or fix the typo)"
        )
    n = check_size(largest + 1, f"file:{path}")
    missing = sorted(set(range(n)) - nodes)
    if missing:
        raise ValueError(
            f"{path}: node ids must be 0..{n - 1} and each must appear, but {missing[:5]} "
            f"{'is' if len(missing) == 1 else 'are'} missing; renumber the nodes"
        )
    return n


def _edge_line(path: str, lineno: int, line: str) -> tuple[int, int, float | None]:
    """(i, j, w or None) of one line of an edge list (comment and blanks removed), or a ValueError
    naming the file and the line."""
    m = _EDGE_LINE.match(line)
    w = None
    if m and m.group(3) is not None:
        try:
            w = float(m.group(3))
        except ValueError:
            m = None
        else:
            if not math.isfinite(w) or w < 0:
                raise ValueError(
                    f"{path}:{lineno}: edge weight {m.group(3)} must be finite and >= 0"
                )
    if m is None:
        raise ValueError(
            f"{path}:{lineno}: cannot parse {line!r}; expected 'i j' or 'i j w' "
            f"with integer node ids >= 0"
        )
    return int(m.group(1)), int(m.group(2)), w


def _read_edges(path: str):
    """The edge list's edges ({(i, j), i < j: (w or None, line)}), its node ids and whether its
    edges carry weights (None: no edge); a ValueError naming the line of a mixed or repeated edge."""
    edges: dict[tuple[int, int], tuple[float | None, int]] = {}
    nodes: set[int] = set()
    weighted: bool | None = None
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            i, j, w = _edge_line(path, lineno, line)
            nodes.update((i, j))
            if i == j:
                continue  # the diagonal is always derived
            if weighted is None:
                weighted = w is not None
            elif weighted != (w is not None):
                raise ValueError(
                    f"{path}:{lineno}: {'missing' if weighted else 'unexpected'} edge weight; "
                    f"give a weight on every edge line or on none"
                )
            key = (min(i, j), max(i, j))
            if key in edges and edges[key][0] != w:
                raise ValueError(
                    f"{path}:{lineno}: edge {key} repeats line {edges[key][1]} with a different weight"
                )
            edges.setdefault(key, (w, lineno))
    return edges, nodes, weighted


def from_edge_list(
    path: str | os.PathLike,
    weights: str | None = None,
    *,
    name: str | None = None,
    require_connected: bool = True,
) -> Topology:
    """Topology from a text file with one edge per line: ``i j`` or ``i j w``.

    Node ids are integers 0..n-1 and every one of them must appear (``i i`` declares a node without
    adding an edge, e.g. the single line ``0 0`` is the one-node topology). ``#`` starts a comment;
    blank lines are ignored. If the edges carry weights, either all or none must; then by default
    W[i,j] = w and the diagonal is 1 − row sum (``weights="given"``). Otherwise, or if ``weights``
    names a scheme, the weights are computed from the structure (default ``"metropolis"``).
    A line that does not parse raises ``ValueError`` naming the file and line number.
    ``require_connected=False`` accepts a disconnected graph, for one member of a cyclic schedule.
    """
    path = os.fspath(path)
    edges, nodes, weighted = _read_edges(path)
    n = node_count(path, nodes)

    if weights is None:
        weights = "given" if weighted else "metropolis"
    check_scheme(weights, extra=("given",))
    if weights == "given" and not weighted:
        raise ValueError(
            f"{path}: weights='given' but the edges carry no weights; use 'i j w' lines"
        )

    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(range(n))
    for (i, j), (w, _) in edges.items():
        g.add_edge(i, j, **({"weight": w} if w is not None else {}))
    return from_graph(
        g,
        weights=weights,
        name=name if name is not None else f"file:{path}",
        require_connected=require_connected,
    )
