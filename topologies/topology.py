"""The ``Topology`` class: a validated mixing matrix plus the diagnostics gossip algorithms need."""

from __future__ import annotations

import hashlib
import math
import numbers
import operator
import sys
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # networkx is imported where a graph is made or read (0.2 s a process)
    import networkx as nx

__all__ = ["Topology", "MAX_PEERS", "check_size", "step_index"]

#: The largest topology built here. W is kept as a dense n×n float64 matrix and its eigenvalues are
#: computed for the diagnostics (γ, spectral gap), which costs n² × 8 bytes of memory and O(n³)
#: time: 4096 peers is 128 MiB and a few seconds, far beyond any cluster one machine simulates.
MAX_PEERS = 4096


def check_size(n: int, what: str) -> int:
    """``n`` if it is at most MAX_PEERS, else a one-line ValueError (before anything is allocated)."""
    if n > MAX_PEERS:
        raise ValueError(
            f"{what} has {n} peers, above the maximum of {MAX_PEERS} (W is a dense n×n matrix: "
            f"{_gigabytes(n)} GB); use at most {MAX_PEERS} peers"
        )
    return n


def _gigabytes(n: int) -> str:
    """n² × 8 bytes in GB, written without a float where it has none (n above 10^154 or so)."""
    try:
        return f"{n * n * 8 / 1e9:.3g}"
    except OverflowError:
        # from the bit length: str() of an int over 4300 digits is refused by Python
        return f"about 1e{int((2 * n.bit_length() + 3) * math.log10(2)) - 9}"


def step_index(t) -> int:
    """``t`` as a step number (an int >= 0), else a one-line ValueError."""
    try:
        if isinstance(t, bool):
            raise TypeError
        t = operator.index(t)
    except TypeError:
        raise ValueError(f"step t must be an integer, got {t!r}") from None
    if t < 0:
        raise ValueError(f"step t must be >= 0, got {t}")
    return t


# Tolerances. Symmetry is checked tightly because PowerGossip's average preservation relies on both
# ends of an edge using the very same W[i,j]; row sums get more slack because the diagonal of a
# user-supplied W is often the result of a subtraction.
SYMMETRY_TOL = 1e-12
STOCHASTIC_TOL = 1e-9
# Eigenvalues of I − W below this count as zero (the consensus direction).
EIGEN_ZERO_TOL = 1e-10


def _is_node_label(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _matrix_from_weighted_graph(g: nx.Graph, nodes: list) -> np.ndarray:
    """W from the "weight" attributes of ``g``'s edges, in ``nodes`` order; diagonal = 1 − row sum.

    Self-loops are ignored: the diagonal is always derived, so that rows sum to one.
    """
    for u, v, data in g.edges(data=True):
        if u == v:
            continue
        w = data.get("weight")
        if w is None:
            raise ValueError(
                f"edge ({u!r}, {v!r}) has no 'weight' attribute; give every edge a weight "
                f"or compute them with weights='metropolis'"
            )
        if not isinstance(w, numbers.Real) or isinstance(w, bool):
            raise ValueError(f"edge ({u!r}, {v!r}) has a non-numeric weight {w!r}")
    import networkx as nx

    w = nx.to_numpy_array(g, nodelist=nodes, weight="weight", nonedge=0.0, dtype=np.float64)
    np.fill_diagonal(w, 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def _check_graph_input(g: nx.Graph) -> None:
    """Reject graph kinds whose meaning as a mixing topology would be ambiguous."""
    if g.is_directed():
        raise ValueError(
            "directed graph given; gossip needs an undirected one: use g.to_undirected()"
        )
    if g.is_multigraph():
        raise ValueError("multigraph given; collapse parallel edges first: use networkx.Graph(g)")
    if g.number_of_nodes() == 0:
        raise ValueError("graph has no nodes; a topology needs at least one")


def count_components(adjacency: np.ndarray) -> int:
    """Number of connected components of the undirected graph with boolean ``adjacency``.

    A breadth-first search over the rows of the dense matrix, one numpy call per level: O(n²) in
    all, where a networkx graph of the edges would hold n²/2 Python objects on a dense graph (the
    complete graph on MAX_PEERS peers took tens of seconds and gigabytes that way).
    """
    adjacency = np.asarray(adjacency, dtype=bool)
    n = adjacency.shape[0]
    seen = np.zeros(n, dtype=bool)
    count = 0
    for start in range(n):
        if seen[start]:
            continue
        count += 1
        seen[start] = True
        frontier = np.array([start])
        while frontier.size:
            reached = adjacency[frontier].any(axis=0) & ~seen
            frontier = np.flatnonzero(reached)
            seen[frontier] = True
    return count


def check_connected(adjacency: np.ndarray) -> None:
    """Raise ``ValueError`` ("graph is not connected: k components") unless the graph is connected."""
    k = count_components(adjacency)
    if k != 1:
        raise ValueError(
            f"graph is not connected: {k} components; gossip cannot reach consensus across "
            f"components, so add edges between them"
        )


def validate_mixing_matrix(w, *, require_connected: bool = True) -> np.ndarray:
    """Check that ``w`` is a valid gossip mixing matrix and return it as a new float64 array.

    Valid means: a square n×n matrix with n ≥ 1, finite, symmetric, doubly stochastic, with
    non-negative off-diagonal entries, whose support graph (j ≠ i with W[i,j] > 0) is connected.
    ``require_connected=False`` drops only the last condition: one step of a time-varying schedule
    (a matching, a sample of edges) is disconnected, and the schedule checks its union instead.
    The diagonal may be negative (best-constant weights do that on irregular graphs) as long as no
    eigenvalue of W falls below −1, so that mixing never amplifies disagreement. Each violation
    raises a one-line ``ValueError`` naming the problem.
    """
    if isinstance(w, np.ndarray) and np.iscomplexobj(w):
        raise ValueError("W is complex; a mixing matrix must be real")
    try:
        w = np.array(w, dtype=np.float64)  # always a copy: the caller's array stays theirs
    except (TypeError, ValueError) as exc:
        raise ValueError(f"W must be a numeric n×n matrix: {exc}") from None
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"W must be a square n×n matrix, got shape {w.shape}")
    n = w.shape[0]
    if n < 1:
        raise ValueError("W is empty; a topology needs at least one node")
    if not np.all(np.isfinite(w)):
        i, j = np.argwhere(~np.isfinite(w))[0]
        raise ValueError(
            f"W has a non-finite entry W[{i},{j}] = {float(w[i, j])}; all weights must be finite"
        )

    off = w.copy()
    np.fill_diagonal(off, 0.0)
    if off.min() < 0:
        i, j = np.unravel_index(np.argmin(off), off.shape)
        raise ValueError(
            f"W has a negative edge weight W[{i},{j}] = {w[i, j]:.6g}; "
            f"mixing weights between nodes must be >= 0"
        )

    asym = np.abs(w - w.T)
    if asym.max() > SYMMETRY_TOL:
        i, j = np.unravel_index(np.argmax(asym), asym.shape)
        i, j = min(i, j), max(i, j)
        raise ValueError(
            f"W is not symmetric: W[{i},{j}] = {float(w[i, j])!r} but W[{j},{i}] = {float(w[j, i])!r}; "
            f"use (W + W.T) / 2 or weights computed by topologies.from_graph"
        )

    rows = w.sum(axis=1)
    dev = np.abs(rows - 1.0)
    if dev.max() > STOCHASTIC_TOL:
        i = int(np.argmax(dev))
        raise ValueError(
            f"W is not doubly stochastic: row {i} sums to {rows[i]:.12g}, not 1; "
            f"set the diagonal to 1 - (sum of the row's edge weights)"
        )

    if require_connected:
        check_connected(off > 0)

    if np.diag(w).min() < 0:
        lam_min = np.linalg.eigvalsh(w)[0]
        if lam_min < -1.0 - STOCHASTIC_TOL:
            i = int(np.argmin(np.diag(w)))
            raise ValueError(
                f"W has eigenvalue {lam_min:.6g} < -1 (negative diagonal, e.g. W[{i},{i}] = "
                f"{w[i, i]:.6g}), so gossip would diverge; use smaller edge weights"
            )
    return w


def _rebuild(w, name, scheme, require_connected=True):
    return Topology(w, name=name, scheme=scheme, require_connected=require_connected)


class ConstantSchedule:
    """What a static graph (undirected `Topology` or `DirectedTopology`) answers as a schedule:
    the same graph at every step, so algorithms written for schedules take static graphs too."""

    def at(self, t: int):
        """The graph of step ``t``: this one, for every t >= 0."""
        step_index(t)
        return self

    @property
    def period(self) -> int:
        """1: the same graph at every step."""
        return 1

    @property
    def union(self):
        """The union of the graphs of all steps: this graph."""
        return self


class Topology(ConstantSchedule):
    """An undirected gossip topology: n nodes 0..n-1 and a validated mixing matrix W.

    Construct it from a matrix, ``Topology(W, name="my-graph")``, from a networkx graph whose nodes
    are 0..n-1 and whose edges carry a ``"weight"`` attribute, ``Topology(g)`` (the diagonal is
    1 − row sum), or — usually — with a generator such as ``topologies.ring(8)`` or
    ``topologies.parse("torus:4x4")``. Construction raises ``ValueError`` if W is not a valid mixing
    matrix (see :func:`validate_mixing_matrix`).

    ``require_connected=False`` accepts a disconnected support graph (every other check stays); it
    is how the steps of a :class:`~topologies.Schedule` are built.

    A topology is also the constant schedule: ``at(t)`` and ``union`` are the topology itself and
    ``period`` is 1, so code written for schedules takes a static topology as well.

    Instances are immutable: ``W`` is a read-only array, ``graph`` a frozen networkx graph, and the
    spectral quantities are computed once, on first use.
    """

    def __init__(
        self,
        W,
        name: str | None = None,
        *,
        scheme: str | None = None,
        require_connected: bool = True,
    ):
        # a networkx graph can only come from code that imported networkx: no import otherwise
        graph_type = getattr(sys.modules.get("networkx"), "Graph", None)
        if graph_type is not None and isinstance(W, graph_type):
            _check_graph_input(W)
            nodes = list(W.nodes)
            bad = [v for v in nodes if not _is_node_label(v)]
            if bad or set(nodes) != set(range(len(nodes))):
                shown = bad[:3] or sorted(set(nodes) - set(range(len(nodes))))[:3]
                raise ValueError(
                    f"graph nodes must be the integers 0..{len(nodes) - 1}, found {shown!r}; "
                    f"use topologies.from_graph(g, weights='given') to relabel them"
                )
            W = _matrix_from_weighted_graph(W, list(range(len(nodes))))
            scheme = scheme or "given"
        w = validate_mixing_matrix(W, require_connected=require_connected)
        w.flags.writeable = False

        set_ = object.__setattr__  # instances are immutable after __init__
        set_(self, "_W", w)
        set_(self, "_name", str(name) if name is not None else f"custom:{w.shape[0]}")
        set_(self, "_scheme", scheme)
        set_(self, "_require_connected", bool(require_connected))
        nbrs = []
        for i in range(w.shape[0]):
            row = np.flatnonzero(w[i] > 0)
            nbrs.append(tuple(row[row != i].tolist()))  # Python ints, as a plain loop would give
        set_(self, "_neighbors", tuple(nbrs))

    def __setattr__(self, key, value):
        raise AttributeError(f"Topology is immutable; cannot set {key!r} (build a new one instead)")

    def __delattr__(self, key):
        raise AttributeError(f"Topology is immutable; cannot delete {key!r}")

    def __reduce__(self):
        # The default pickle path would restore W as a writeable array and skip validation.
        return (_rebuild, (np.array(self._W), self._name, self._scheme, self._require_connected))

    # --- basic structure -------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of nodes n."""
        return self._W.shape[0]

    @property
    def name(self) -> str:
        """The spec string this topology was built from, e.g. ``"torus:4x4"``."""
        return self._name

    @property
    def scheme(self) -> str | None:
        """The weight scheme used (``"metropolis"``, …, ``"given"``), or None for a raw matrix."""
        return self._scheme

    @property
    def W(self) -> np.ndarray:
        """The mixing matrix: float64 n×n, symmetric, doubly stochastic, read-only."""
        return self._W

    def _node(self, i) -> int:
        i = operator.index(i)
        if not 0 <= i < self.size:
            raise IndexError(f"node {i} out of range for a topology of size {self.size}")
        return i

    def neighbors(self, i: int) -> tuple[int, ...]:
        """Sorted neighbours of node ``i``: the j ≠ i with W[i,j] > 0."""
        return self._neighbors[self._node(i)]

    def weight(self, i: int, j: int) -> float:
        """The mixing weight W[i, j] (0.0 when i and j are not neighbours)."""
        return float(self._W[self._node(i), self._node(j)])

    @cached_property
    def degrees(self) -> tuple[int, ...]:
        """Number of neighbours of each node, by rank."""
        return tuple(len(nb) for nb in self._neighbors)

    def edges(self) -> list[tuple[int, int]]:
        """All edges as ``(i, j)`` with i < j, sorted."""
        return [(i, j) for i, nb in enumerate(self._neighbors) for j in nb if i < j]

    @cached_property
    def graph(self) -> nx.Graph:
        """The topology as a frozen ``networkx.Graph``; edge attribute ``"weight"`` is W[i,j]."""
        import networkx as nx

        g = nx.Graph(name=self._name)
        g.add_nodes_from(range(self.size))
        g.add_weighted_edges_from((i, j, float(self._W[i, j])) for i, j in self.edges())
        return nx.freeze(g)

    @property
    def is_directed(self) -> bool:
        """False: W is symmetric. (Directed graphs are :class:`~topologies.DirectedTopology`.)"""
        return False

    # --- as the constant schedule (at, period, union: ConstantSchedule) ----------------------

    def neighbors_union(self, i: int) -> tuple[int, ...]:
        """Neighbours of ``i`` at some step; for a static topology, :meth:`neighbors`."""
        return self.neighbors(i)

    # --- spectral diagnostics --------------------------------------------------------------

    @cached_property
    def eigenvalues(self) -> np.ndarray:
        """Eigenvalues of W in descending order (the first is 1), read-only."""
        lam = np.linalg.eigvalsh(self._W)[::-1].copy()
        lam.flags.writeable = False
        return lam

    @cached_property
    def spectral_gap(self) -> float:
        """``1 − max(|λ₂|, |λₙ|)`` of W: the per-round contraction of disagreement. 1.0 when n = 1."""
        if self.size == 1:
            return 1.0
        lam = self.eigenvalues
        return float(1.0 - max(abs(lam[1]), abs(lam[-1])))

    @cached_property
    def gamma(self) -> float:
        """Consensus step size 2 / (μ_min + μ_max) over the non-zero eigenvalues μ of I − W.

        This is the step the PowerGossip authors use for exact gossip and for PowerGossip alike
        (8-ring with weights 1/3: γ ≈ 1.308). 1.0 when there are no non-zero eigenvalues (n = 1).
        """
        mu = 1.0 - self.eigenvalues
        mu = mu[np.abs(mu) > EIGEN_ZERO_TOL]
        if mu.size == 0:
            return 1.0
        return float(2.0 / (mu.min() + mu.max()))

    @cached_property
    def gamma_stable_max(self) -> float:
        """The largest stable consensus step: exact gossip x ← x − γ(I − W)x contracts every
        disagreement direction iff 0 < γ < 2 / μ_max, μ_max the largest eigenvalue of I − W.

        (At γ = 2 / μ_max the slowest direction neither grows nor shrinks.) ``inf`` when n = 1.
        """
        mu = 1.0 - self.eigenvalues
        mu = mu[np.abs(mu) > EIGEN_ZERO_TOL]
        if mu.size == 0:
            return float("inf")
        return float(2.0 / mu.max())

    def check_gamma(self, gamma: float) -> None:
        """Raise a one-line ValueError unless exact gossip with step ``gamma`` converges here."""
        top = self.gamma_stable_max
        if not (0.0 < gamma < top):
            raise ValueError(
                f"gamma={gamma:g} is outside the stable range (0, {top:.4g}) of {self._name} "
                f"(2 / largest eigenvalue of I - W): gossip would diverge; the topology's own "
                f"gamma is {self.gamma:.4g}"
            )

    @cached_property
    def fingerprint(self) -> str:
        """A stable sha256 hex digest of n and W (not the name), for cross-rank agreement checks.

        W is rounded to 12 decimals first so that last-bit differences (say a diagonal computed in
        another summation order) do not make otherwise identical topologies disagree.
        """
        canon = np.round(self._W, 12) + 0.0  # + 0.0 turns -0.0 into 0.0
        h = hashlib.sha256(b"topologies.Topology/v1\0")
        h.update(np.uint64(self.size).astype("<u8").tobytes())
        h.update(np.ascontiguousarray(canon, dtype="<f8").tobytes())
        return h.hexdigest()

    # --- dunder ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        scheme = f", weights={self._scheme!r}" if self._scheme else ""
        return f"Topology({self._name!r}, size={self.size}, edges={len(self.edges())}{scheme})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return self._name == other._name and np.array_equal(self._W, other._W)

    def __hash__(self) -> int:
        return hash((self._name, self.fingerprint))
