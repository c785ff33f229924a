"""`Schedule`: what every undirected time-varying topology shares (the schedules themselves, their
factories and their spelling are in `schedules.py`, which re-exports these names).

A schedule builds the Metropolis W of each step's graph from its `_step_edges(t)`, checks that the
union of its graphs is connected (over one period, or a random schedule's first
:func:`random_window` steps), and gives the stable range of the consensus step γ and the union
graph that per-edge state is sized from.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .stepcache import StepCache
from .topology import Topology
from .weights import weight_matrix

__all__ = ["Schedule", "WINDOW_PER_PEER", "metropolis_on", "random_window"]

#: Random schedules are validated over their first WINDOW_PER_PEER · n steps.
WINDOW_PER_PEER = 64


def random_window(n: int) -> int:
    """Steps over which a random schedule on ``n`` peers must have a connected union: 64·n."""
    return WINDOW_PER_PEER * n


class _Components:
    """Union-find over 0..n-1 that counts its components, for incremental connectivity checks."""

    def __init__(self, n: int):
        self.parent = list(range(n))
        self.count = n

    def _root(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    def join(self, edges: np.ndarray, chunk: int = 4096) -> None:
        # In chunks, stopping once connected: a dense step (edge sampling of a complete graph)
        # connects everything within its first few thousand of millions of edges.
        for start in range(0, len(edges), chunk):
            if self.count == 1:
                return
            for u, v in edges[start : start + chunk].tolist():
                ru, rv = self._root(u), self._root(v)
                if ru != rv:
                    self.parent[ru] = rv
                    self.count -= 1


def metropolis_on(n: int, edges: np.ndarray) -> np.ndarray:
    """Metropolis W of the graph on n nodes with the (k, 2) ``edges``; isolated nodes keep 1."""
    adj = np.zeros((n, n), dtype=bool)
    adj[edges[:, 0], edges[:, 1]] = True
    adj[edges[:, 1], edges[:, 0]] = True
    np.fill_diagonal(adj, False)
    return weight_matrix(adj, "metropolis")


class Schedule(StepCache):
    """An undirected time-varying topology: ``at(t)`` is the :class:`Topology` of step t.

    Each step's W is symmetric and doubly stochastic (Metropolis weights on the step's graph
    unless the schedule says otherwise); the union of the graphs is connected. Build one with
    :func:`one_peer_exponential`, :func:`matchings`, :func:`edge_sampling`, :func:`cyclic` or
    :func:`topologies.parse`.
    """

    @property
    def is_directed(self) -> bool:
        """False: every step is undirected (directed ones are :class:`DirectedSchedule`)."""
        return False

    def _step_edges(self, t: int) -> np.ndarray:
        """The (k, 2) int array of edges active at step ``t``."""
        raise NotImplementedError

    def _build(self, t: int) -> Topology:
        w = metropolis_on(self._size, self._step_edges(t))
        return Topology(w, name=f"{self._name}@{t}", scheme="metropolis", require_connected=False)

    def _check_union_connected(self, fix: str = "add edges between them") -> None:
        """One-line ValueError unless the graphs of one period (or the random window) connect."""
        n = self._size
        components = _Components(n)
        steps = self._period or random_window(n)
        for t in range(steps):
            if components.count == 1:
                return
            components.join(self._step_edges(t))
        if components.count == 1:
            return
        over = (
            f"one period ({steps} steps)"
            if self._period
            else f"the first {steps} steps ({WINDOW_PER_PEER} per peer)"
        )
        raise ValueError(
            f"schedule {self._name!r} is not connected: the union of its graphs over {over} has "
            f"{components.count} components, so gossip cannot reach consensus; {fix}"
        )

    @cached_property
    def gamma_stable_max(self) -> float:
        """The largest consensus step stable at every step of the schedule.

        Exact gossip's step x ← x − γ(I − W(t))x is non-expansive for every disagreement iff
        0 < γ < 2 / μ_max(t), μ_max(t) the largest eigenvalue of I − W(t) (`Topology`'s range), so
        the range of a schedule is the intersection of its graphs' ranges: the smallest bound over
        one period. A random schedule has no period; `_random_gamma_bound` is a bound that holds
        for every graph it can draw.
        """
        if self._period:
            return min(self.at(t).gamma_stable_max for t in range(self._period))
        return self._random_gamma_bound()

    def _random_gamma_bound(self) -> float:
        """(1 + D) / D, D the largest degree of the union: a conservative bound for any step.

        Every step's W has Metropolis weights on a subgraph of the union, so row i of I − W(t) has
        diagonal s_i = Σ_j w_ij ≤ d_i / (1 + d_i) and off-diagonal sum s_i; by Gershgorin
        μ_max(t) ≤ 2 max_i s_i ≤ 2D / (1 + D), and 2 / μ_max(t) ≥ (1 + D) / D.
        """
        top = max(self.union.degrees)
        return (1.0 + top) / top

    def check_gamma(self, gamma: float) -> None:
        """Raise a one-line ValueError unless `gamma` is in the stable range of every step."""
        top = self.gamma_stable_max
        if not (0.0 < gamma < top):
            over = (
                f"the smallest of 2 / largest eigenvalue of I - W(t) over one period, "
                f"{self._period} graphs"
                if self._period
                else "a bound that holds for every graph this random schedule can draw"
            )
            raise ValueError(
                f"gamma={gamma:g} is outside the stable range (0, {top:.4g}) of {self._name} "
                f"({over}): gossip would diverge; on a schedule the default gamma is 1 (plain "
                f"mixing with each step's W)"
            )

    @cached_property
    def union(self) -> Topology:
        """Every edge active at some step, with Metropolis weights (connected).

        For the random schedules this is the set of edges that can be drawn (all pairs for
        matchings, the base graph for edge sampling), so per-edge state sized from it never misses
        an edge of a later step.
        """
        edges = np.concatenate([self._step_edges(t) for t in range(self._period)])
        return Topology(
            metropolis_on(self._size, edges), name=f"union({self._name})", scheme="metropolis"
        )
