"""Topology repair: the graph the live peers gossip on after peers leave or (re)join.

A membership change keeps the peer ids 0..n-1 of the run's topology. ``repair(topology, live)``
is a :class:`Repaired` schedule over the same n ids in which every absent peer is isolated (no
edge: its row of W is the identity's) and the live peers are linked by the rule of the
topology's kind. It is a pure function of (topology, live set), so every peer derives the same
graph without talking, and a peer that comes back gets its edges back.

Static kinds (``rebuild``: the spec built again on the live peers, taken in id order, which is
the cyclic order of ring and exponential; ``bridge``: every edge between live peers is kept, and
the live neighbours of each group of departed peers are linked):

=================  ==================================================================================
ring               rebuild: the ring on the live peers in cyclic order (ring:8 minus peer 3 is the
                   ring 0-1-2-4-5-6-7: peer 3's two neighbours are linked)
complete           rebuild: the complete graph on the live peers
star               rebuild: the hub stays; if the hub itself is gone, the smallest live id is the hub
exponential        rebuild: positions p ~ p + 2^k (mod m) of the m live peers in id order, so the
                   O(log m) degree and the spectral gap of an exponential graph are kept (most
                   edges change at each membership change)
anything else      bridge (torus, grid, hypercube, random_regular, small_world, file, graph, custom)
=================  ==================================================================================

Bridge: for every connected component C of the departed peers in the full graph, the live peers
adjacent to C are linked in a ring in id order (two of them: one edge; one: nothing). A path
between live peers that went through C now goes around it, so the live peers stay connected, and
every edge between live peers keeps its state.

Schedules (their union graph holds every edge a step can use; per-edge state is sized by it):

=====================  ==============================================================================
one_peer_exponential   rebuild: position p pairs with p XOR 2^(t mod k), k = ceil(log2 m); a peer
                       whose partner position is >= m idles that step (union connected for any m)
matchings              a random matching of the live peers each step, seeded by (seed, t); one peer
                       idles when m is odd (union: the complete graph on the live peers)
edge_sampling          the same sampling (p, seed) of the repaired base graph
cyclic                 every member repaired by its own kind's rule; the union must stay connected
directed graphs        refused (push-sum's column-stochastic P has no repair rule here)
=====================  ==============================================================================

Weights: a static graph keeps its own scheme (`weights.SCHEMES`), recomputed on the live peers'
graph; "uniform" on a repaired graph that is no longer regular, and given weights (a weighted
file), become Metropolis, since no other choice is symmetric and doubly stochastic there. Every
step of a schedule has Metropolis weights, as the schedules here do. The consensus step and its
stable range (`gamma`, `gamma_stable_max`, `check_gamma`) are the repaired graph's own: the
eigenvalues of I - W are the live subgraph's, the absent peers adding only zeros, which are
left out.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .schedules import (
    CyclicSchedule,
    EdgeSampling,
    OnePeerExponential,
    RandomMatchings,
    Schedule,
    metropolis_on,
)
from .topology import Topology, count_components
from .weights import SCHEMES, weight_matrix

if TYPE_CHECKING:
    from .spec import AnyTopology

__all__ = ["Repaired", "repair", "REBUILT_KINDS", "describe_live"]

#: Static kinds rebuilt on the live peers; every other static kind is bridged.
REBUILT_KINDS = ("ring", "complete", "star", "exponential")


def describe_live(ids) -> str:
    """Ids as compact ranges: (0, 1, 2, 5, 7, 8) -> "0-2,5,7-8"."""
    ids = sorted(set(int(i) for i in ids))
    out, start = [], None
    for k, i in enumerate(ids):
        if start is None:
            start = i
        if k + 1 == len(ids) or ids[k + 1] != i + 1:
            out.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ",".join(out)


def _kind(topology: AnyTopology) -> str:
    return topology.name.partition(":")[0].strip().lower()


def _pairs(edges) -> np.ndarray:
    return np.asarray(list(edges), dtype=np.int64).reshape(-1, 2)


def _rebuilt_edges(kind: str, live: tuple) -> np.ndarray:
    m = len(live)
    ids = np.asarray(live, dtype=np.int64)
    if m == 1:
        return _pairs([])
    if kind == "ring":
        return np.stack([ids, np.roll(ids, -1)], axis=1)[: m if m > 2 else 1]
    if kind == "complete":
        i, j = np.triu_indices(m, k=1)
        return np.stack([ids[i], ids[j]], axis=1)
    if kind == "star":
        hub = 0 if 0 in live else live[0]
        return _pairs((hub, k) for k in live if k != hub)
    # exponential: position p ~ p + 2^k (mod m) for every 2^k < m
    offsets = [1 << b for b in range(max(m - 1, 1).bit_length()) if (1 << b) < m]
    return _pairs((ids[p], ids[(p + off) % m]) for p in range(m) for off in offsets)


def _departed_components(adjacency: np.ndarray, departed: np.ndarray):
    """The connected components of the departed peers in the full graph, as id arrays."""
    seen = np.zeros(adjacency.shape[0], dtype=bool)
    gone = np.zeros(adjacency.shape[0], dtype=bool)
    gone[departed] = True
    for start in departed:
        if seen[start]:
            continue
        seen[start] = True
        component, frontier = [start], np.array([start])
        while frontier.size:
            reached = adjacency[frontier].any(axis=0) & gone & ~seen
            frontier = np.flatnonzero(reached)
            seen[frontier] = True
            component.extend(frontier.tolist())
        yield np.array(sorted(component))


def _bridged_edges(base: Topology, live: tuple) -> np.ndarray:
    adjacency = base.W > 0
    np.fill_diagonal(adjacency, False)
    alive = np.zeros(base.size, dtype=bool)
    alive[list(live)] = True
    kept = np.argwhere(np.triu(adjacency & alive[:, None] & alive[None, :], k=1))
    bridges = []
    for component in _departed_components(adjacency, np.flatnonzero(~alive)):
        around = np.flatnonzero(adjacency[component].any(axis=0) & alive)
        if len(around) >= 2:
            ring = list(zip(around, np.roll(around, -1)))
            bridges += ring if len(around) > 2 else ring[:1]
    return np.concatenate([kept, _pairs(bridges)]) if bridges else kept.reshape(-1, 2)


def _static_weights(n: int, live: tuple, edges: np.ndarray, scheme) -> np.ndarray:
    """W over the n ids: the scheme's weights of the live peers' graph, absent peers isolated."""
    ids = np.asarray(live, dtype=np.int64)
    position = np.full(n, -1, dtype=np.int64)
    position[ids] = np.arange(len(ids))
    sub = np.zeros((len(ids), len(ids)), dtype=bool)
    if len(edges):
        a, b = position[edges[:, 0]], position[edges[:, 1]]
        sub[a, b] = sub[b, a] = True
    np.fill_diagonal(sub, False)
    degrees = sub.sum(axis=1)
    regular = len(ids) == 0 or degrees.min() == degrees.max()
    if scheme not in SCHEMES or (scheme == "uniform" and not regular):
        scheme = "metropolis"
    w = np.eye(n)
    w[np.ix_(ids, ids)] = weight_matrix(sub, scheme)
    return w, scheme


class Repaired(Schedule):
    """The graph of the live peers of one membership (see the module docstring), as a schedule
    over the run's n ids: ``at(t)`` is a `Topology` of n nodes with the absent peers isolated.

    `static` is that one graph when the run's topology is static (then the schedule has period 1
    and `gamma` is the graph's own consensus step), else None.
    """

    def __init__(self, base, live):
        if base.is_directed:
            raise ValueError(
                f"topology {base.name!r} is directed: peers cannot leave or join it (push-sum's "
                "column-stochastic P has no repair rule here); use an undirected topology"
            )
        live = tuple(sorted(set(int(k) for k in live)))
        if not live:
            raise ValueError(f"no live peer left on {base.name!r}: at least one must stay")
        bad = [k for k in live if not 0 <= k < base.size]
        if bad:
            raise ValueError(
                f"peer {bad[0]} is not a peer of {base.name!r} (its ids are 0..{base.size - 1})"
            )
        self._base, self._live, self._kind = base, live, _kind(base)
        self._static = None
        self._members = None
        name = f"{base.name}@live[{describe_live(live)}]"
        period = self._plan(base)
        self._setup(base.size, name, period, ("repaired", base.fingerprint, live))
        self._check_live_connected()

    def _plan(self, base):
        """Set up what the steps are built from; return the period (None for a random one)."""
        if isinstance(base, Topology):
            self._static = _repaired_static(base, self._live)
            return 1
        if isinstance(base, OnePeerExponential):
            return max(1, (len(self._live) - 1).bit_length())
        if isinstance(base, RandomMatchings):
            self._seed = base._seed
            return None
        if isinstance(base, EdgeSampling):
            repaired = _repaired_static(base.base, self._live)
            self._sampled = np.asarray(repaired.edges(), dtype=np.int64).reshape(-1, 2)
            self._sampled_base, self._p, self._seed = repaired, base.p, base._seed
            return None
        if isinstance(base, CyclicSchedule):
            self._members = tuple(_repaired_static(m, self._live) for m in base.members)
            return len(self._members)
        raise ValueError(
            f"no repair rule for schedule {base.name!r} ({type(base).__name__}); "
            "peers cannot leave or join it"
        )

    # ---- what the peers read ------------------------------------------------------------------
    @property
    def base(self):
        """The run's topology (or schedule) that was repaired."""
        return self._base

    @property
    def live(self) -> tuple:
        """The live peers' ids, ascending."""
        return self._live

    @property
    def static(self):
        """The repaired graph when the run's topology is static, else None."""
        return self._static

    @property
    def gamma(self) -> float:
        """The repaired static graph's consensus step (no attribute on a schedule, like
        `Schedule`: there the algorithms' default step is 1)."""
        if self._static is None:
            raise AttributeError("a repaired schedule has no single consensus step")
        return self._static.gamma

    # ---- the steps ----------------------------------------------------------------------------
    def _step_edges(self, t: int) -> np.ndarray:
        if self._static is not None:
            return np.asarray(self._static.edges(), dtype=np.int64).reshape(-1, 2)
        if self._members is not None:
            return np.asarray(self._members[t].edges(), dtype=np.int64).reshape(-1, 2)
        live, m = np.asarray(self._live, dtype=np.int64), len(self._live)
        if isinstance(self._base, OnePeerExponential):
            p = np.arange(m)
            q = p ^ (1 << (t % self._period))
            keep = (p < q) & (q < m)
            return np.stack([live[p[keep]], live[q[keep]]], axis=1)
        rng = np.random.default_rng(np.random.SeedSequence([self._seed, t]))
        if isinstance(self._base, RandomMatchings):
            order = rng.permutation(live)
            return order[: m - m % 2].reshape(-1, 2)
        return self._sampled[rng.random(len(self._sampled)) < self._p]

    def _build(self, t: int) -> Topology:
        if self._static is not None:
            return self._static
        if self._members is not None:
            return self._members[t]
        w = metropolis_on(self._size, self._step_edges(t))
        return Topology(w, name=f"{self._name}@{t}", scheme="metropolis", require_connected=False)

    @cached_property
    def union(self) -> Topology:
        """Every edge some step can use, Metropolis weights (the static graph itself)."""
        if self._static is not None:
            return self._static
        if isinstance(self._base, EdgeSampling):
            edges = self._sampled
        elif isinstance(self._base, RandomMatchings):
            i, j = np.triu_indices(len(self._live), k=1)
            live = np.asarray(self._live, dtype=np.int64)
            edges = np.stack([live[i], live[j]], axis=1)
        else:
            edges = np.concatenate([self._step_edges(t) for t in range(self._period)])
        return Topology(
            metropolis_on(self._size, edges),
            name=f"union({self._name})",
            scheme="metropolis",
            require_connected=False,
        )

    def _check_live_connected(self) -> None:
        """One-line ValueError unless the live peers' union graph is connected."""
        live = list(self._live)
        adjacency = self.union.W[np.ix_(live, live)] > 0
        np.fill_diagonal(adjacency, False)
        components = count_components(adjacency)
        if components != 1:
            gone = sorted(set(range(self._size)) - set(self._live))
            raise ValueError(
                f"after peers {describe_live(gone)} left {self._base.name!r}, the union of the "
                f"live peers' graphs has {components} components: gossip cannot reach "
                "consensus among them; use a denser topology"
            )


def _repaired_static(base: Topology, live: tuple) -> Topology:
    """The static graph of `live` on `base` (module docstring's rule for its kind)."""
    kind = _kind(base)
    if kind in REBUILT_KINDS:
        edges = _rebuilt_edges(kind, live)
    else:
        edges = _bridged_edges(base, live)
    w, scheme = _static_weights(base.size, live, edges, base.scheme)
    name = f"{base.name}@live[{describe_live(live)}]"
    return Topology(w, name=name, scheme=scheme, require_connected=False)


def repair(topology: AnyTopology, live) -> Repaired:
    """The graph the `live` peers of `topology` gossip on (see the module docstring)."""
    return Repaired(topology, live)
