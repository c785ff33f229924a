"""Directed gossip graphs for push-sum: column-stochastic weights, static or one per step.

In push-sum, peer j keeps P[j,j] of its (value, weight) pair and sends P[i,j] of it to each
out-neighbour i; P is column-stochastic (each column sums to 1), not symmetric. These classes are
deliberately not :class:`~topologies.Topology` subclasses, and ``is_directed`` is True, so a
directed graph is never taken for an undirected one (or the reverse).

>>> import topologies
>>> s = topologies.parse("directed_exponential:8")
>>> s.period, s.at(0).out_neighbors(0), s.at(2).out_neighbors(0)
(3, (1,), (4,))
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from functools import cached_property

import numpy as np

from .generators import _int
from .importers import node_count
from .stepcache import StepCache
from .topology import STOCHASTIC_TOL, ConstantSchedule, check_size

__all__ = [
    "DirectedTopology",
    "DirectedSchedule",
    "directed_exponential",
    "from_directed_edge_list",
    "push_weights",
    "validate_column_stochastic",
]


def _strong_components(n: int, edges) -> int:
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    return nx.number_strongly_connected_components(g)


def cycle_period(support: np.ndarray) -> int:
    """The period of the strongly connected graph with boolean ``support`` (support[i, j]: an edge
    j → i, a self-loop where support[i, i]): the gcd of the lengths of its cycles, 1 when it is
    aperiodic. From breadth-first levels: the gcd over every edge u → v of level(u) + 1 − level(v).
    """
    n = support.shape[0]
    level = np.full(n, -1, dtype=np.int64)
    level[0], frontier, depth = 0, np.array([0]), 0
    while frontier.size:
        depth += 1
        frontier = np.flatnonzero(support[:, frontier].any(axis=1) & (level < 0))
        level[frontier] = depth
    dst, src = np.nonzero(support)
    return math.gcd(*(int(d) for d in np.abs(level[src] + 1 - level[dst])))


def validate_column_stochastic(p, *, require_connected: bool = True) -> np.ndarray:
    """Check that ``p`` is a valid push-sum matrix and return it as a new float64 array.

    Valid means: square n×n with n ≥ 1, finite, every entry ≥ 0, every column summing to 1, and
    (unless ``require_connected=False``, for one step of a schedule) a strongly connected support
    graph j → i for P[i,j] > 0 that is aperiodic (its cycles' lengths have gcd 1, as when any peer
    keeps a share P[i,i] > 0: with a periodic P, say a rotation, the pairs would circulate and
    never mix). Each violation raises a one-line ``ValueError``.
    """
    try:
        p = np.array(p, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"P must be a numeric n×n matrix: {exc}") from None
    if p.ndim != 2 or p.shape[0] != p.shape[1] or p.shape[0] < 1:
        raise ValueError(f"P must be a square n×n matrix with n >= 1, got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        i, j = np.argwhere(~np.isfinite(p))[0]
        raise ValueError(f"P has a non-finite entry P[{i},{j}]; all weights must be finite")
    if p.min() < 0:
        i, j = np.unravel_index(np.argmin(p), p.shape)
        raise ValueError(
            f"P has a negative weight P[{i},{j}] = {p[i, j]:.6g}; push-sum weights must be >= 0"
        )
    cols = p.sum(axis=0)
    dev = np.abs(cols - 1.0)
    if dev.max() > STOCHASTIC_TOL:
        j = int(np.argmax(dev))
        raise ValueError(
            f"P is not column-stochastic: column {j} sums to {cols[j]:.12g}, not 1; "
            f"split each sender's value so that its shares add up to 1"
        )
    if require_connected:
        off = p > 0
        np.fill_diagonal(off, False)
        dst, src = np.nonzero(off)
        k = _strong_components(p.shape[0], zip(src.tolist(), dst.tolist()))
        if k != 1:
            raise ValueError(
                f"directed graph is not strongly connected: {k} strong components; push-sum "
                f"cannot reach consensus unless every peer reaches every other, so add edges"
            )
        period = cycle_period(p > 0)
        if period > 1:
            raise ValueError(
                f"P is periodic: every cycle of its graph has a length that is a multiple of "
                f"{period}, so push-sum would pass the values around and never reach consensus; "
                f"give some peer a positive self weight P[i,i]"
            )
    return p


def push_weights(n: int, edges) -> np.ndarray:
    """Uniform push-sum P of the directed ``edges`` (src, dst): each sender keeps and sends
    1 / (out-degree + 1), so every column sums to 1."""
    adj = np.zeros((n, n), dtype=bool)  # adj[dst, src]
    e = np.asarray(list(edges) if not isinstance(edges, np.ndarray) else edges, dtype=np.int64)
    e = e.reshape(-1, 2)
    adj[e[:, 1], e[:, 0]] = True
    np.fill_diagonal(adj, True)
    return adj / adj.sum(axis=0, keepdims=True)


def _rebuild(p, name, require_connected):
    return DirectedTopology(p, name=name, require_connected=require_connected)


class DirectedTopology(ConstantSchedule):
    """A directed gossip graph: n peers and a validated column-stochastic P (see module doc).

    ``DirectedTopology(P, name=...)`` validates P (:func:`validate_column_stochastic`);
    :func:`from_directed_edge_list` builds one from ``i j`` lines. As the constant schedule,
    ``at(t)`` and ``union`` are the graph itself and ``period`` is 1. Immutable.
    """

    def __init__(self, P, name: str | None = None, *, require_connected: bool = True):
        p = validate_column_stochastic(P, require_connected=require_connected)
        p.flags.writeable = False
        set_ = object.__setattr__
        set_(self, "_P", p)
        set_(self, "_name", str(name) if name is not None else f"directed:{p.shape[0]}")
        set_(self, "_require_connected", bool(require_connected))
        off = p > 0
        np.fill_diagonal(off, False)
        set_(
            self,
            "_out",
            tuple(tuple(int(i) for i in np.flatnonzero(off[:, j])) for j in range(p.shape[0])),
        )
        set_(
            self,
            "_in",
            tuple(tuple(int(j) for j in np.flatnonzero(off[i])) for i in range(p.shape[0])),
        )

    def __setattr__(self, key, value):
        raise AttributeError(f"DirectedTopology is immutable; cannot set {key!r}")

    def __reduce__(self):
        return (_rebuild, (np.array(self._P), self._name, self._require_connected))

    @property
    def size(self) -> int:
        """Number of peers n."""
        return self._P.shape[0]

    @property
    def name(self) -> str:
        """The spec string or file this graph was built from."""
        return self._name

    @property
    def P(self) -> np.ndarray:
        """The push-sum matrix: P[i,j] is the share of j's value that j sends to i; read-only."""
        return self._P

    @property
    def is_directed(self) -> bool:
        """True: P is column-stochastic, not symmetric."""
        return True

    def _node(self, i) -> int:
        i = _int(i, "peer", 0)
        if i >= self.size:
            raise IndexError(f"node {i} out of range for a topology of size {self.size}")
        return i

    def out_neighbors(self, j: int) -> tuple[int, ...]:
        """Sorted peers that ``j`` sends to (i ≠ j with P[i,j] > 0)."""
        return self._out[self._node(j)]

    def in_neighbors(self, i: int) -> tuple[int, ...]:
        """Sorted peers that send to ``i`` (j ≠ i with P[i,j] > 0)."""
        return self._in[self._node(i)]

    @cached_property
    def out_degrees(self) -> tuple[int, ...]:
        """Number of out-neighbours of each peer, by rank."""
        return tuple(len(o) for o in self._out)

    def edges(self) -> list[tuple[int, int]]:
        """All directed edges as ``(src, dst)``, sorted."""
        return [(j, i) for j, outs in enumerate(self._out) for i in outs]

    @cached_property
    def spectral_gap(self) -> float:
        """1 − |λ₂| of P, the per-step contraction of push-sum; 1.0 when n = 1."""
        if self.size == 1:
            return 1.0
        moduli = np.sort(np.abs(np.linalg.eigvals(self._P)))[::-1]
        return float(1.0 - moduli[1])

    @cached_property
    def fingerprint(self) -> str:
        """A stable sha256 hex digest of n and P, distinct from any undirected topology's."""
        canon = np.round(self._P, 12) + 0.0
        h = hashlib.sha256(b"topologies.DirectedTopology/v1\0")
        h.update(np.uint64(self.size).astype("<u8").tobytes())
        h.update(np.ascontiguousarray(canon, dtype="<f8").tobytes())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"DirectedTopology({self._name!r}, size={self.size}, edges={len(self.edges())})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, DirectedTopology):
            return NotImplemented
        return self._name == other._name and np.array_equal(self._P, other._P)

    def __hash__(self) -> int:
        return hash((self._name, self.fingerprint))


class DirectedSchedule(StepCache):
    """A periodic directed schedule: ``at(t)`` is the :class:`DirectedTopology` of step t.

    Given the directed edge lists of one period, each step gets uniform push weights
    (:func:`push_weights`); the union over the period must be strongly connected.
    """

    _TAG = b"topologies.DirectedSchedule/v1\0"

    def __init__(self, size: int, period_edges, name: str, identity: tuple | None = None):
        edges = [np.asarray(e, dtype=np.int64).reshape(-1, 2) for e in period_edges]
        if not edges:
            raise ValueError("a directed schedule needs the edges of at least one step")
        identity = (
            identity
            if identity is not None
            else ("directed", size, tuple(tuple(map(tuple, e.tolist())) for e in edges))
        )
        self._setup(size, name, len(edges), identity)
        self._edges = edges
        k = _strong_components(size, (tuple(e) for step in edges for e in step.tolist()))
        if k != 1:
            raise ValueError(
                f"schedule {name!r} is not strongly connected: the union of its graphs over one "
                f"period ({len(edges)} steps) has {k} strong components; add edges"
            )

    @property
    def is_directed(self) -> bool:
        """True: every step is a column-stochastic directed graph."""
        return True

    def _build(self, t: int) -> DirectedTopology:
        return DirectedTopology(
            push_weights(self._size, self._edges[t]),
            name=f"{self._name}@{t}",
            require_connected=False,
        )

    @cached_property
    def union(self) -> DirectedTopology:
        """Every directed edge of some step, with uniform push weights (strongly connected)."""
        return DirectedTopology(
            push_weights(self._size, np.concatenate(self._edges)), name=f"union({self._name})"
        )


def directed_exponential(n: int) -> DirectedSchedule:
    """At step t each peer i sends to i + 2^(t mod k) (mod n), k = ⌈log2 n⌉, keeping half.

    For n a power of two the product of P over one period is exactly J/n.
    """
    n = check_size(_int(n, "directed_exponential size n", 2), f"directed_exponential:{n}")
    offsets = [1 << k for k in range((n - 1).bit_length())]
    peers = np.arange(n)
    period_edges = [np.stack([peers, (peers + off) % n], axis=1) for off in offsets]
    return DirectedSchedule(
        n, period_edges, f"directed_exponential:{n}", ("directed_exponential", n)
    )


_DIRECTED_LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s*$", re.ASCII)


def from_directed_edge_list(
    path: str | os.PathLike, *, name: str | None = None
) -> DirectedTopology:
    """Directed graph from a text file of ``i j`` lines, each meaning i → j (i sends to j).

    Node ids are 0..n-1 and each must appear (``i i`` declares a node). ``#`` starts a comment.
    Weights are uniform, 1 / (out-degree + 1) on each out-edge and on the peer itself. The graph
    must be strongly connected. A line that does not parse raises ``ValueError`` naming the line.
    """
    path = os.fspath(path)
    edges: set[tuple[int, int]] = set()
    nodes: set[int] = set()
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            m = _DIRECTED_LINE.match(line)
            if m is None:
                raise ValueError(
                    f"{path}:{lineno}: cannot parse {line!r}; expected 'i j' (i sends to j) with "
                    f"integer node ids >= 0"
                )
            i, j = int(m.group(1)), int(m.group(2))
            nodes.update((i, j))
            if i != j:
                edges.add((i, j))
    n = node_count(path, nodes)
    return DirectedTopology(
        push_weights(n, sorted(edges)), name=name if name is not None else f"directed_file:{path}"
    )
