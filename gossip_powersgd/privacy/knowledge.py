"""The knowledge-matrix attack on gossip: what colluding peers reconstruct of peers they never hear.

El Mrini, Cyffers, Bellet, "Privacy Attacks in Decentralized Learning", ICML 2024. In linear gossip
every value a peer receives is a known linear combination of every peer's private contributions,
so a curious peer (or a set of colluders) accumulates the messages it receives as equations in
them, K u = y, and solves: a contribution is reconstructed exactly when it is determined by the
system (its unit vector lies in K's row space: the paper row-reduces K, we project), whether or
not its owner is a neighbour.

The model (exact gossip, and the tensors PowerGossip gossips exactly): peer i sends, at gossip
step t, y_i(t) = x_i(t) + u_i(t), its model after its local update u_i(t), and mixes
x(t + 1) = M_t y(t), M_t = (1 - gamma) I + gamma W(t). With the common initial model x0 (public)
and mixing that keeps constants, y_w(t) - x0 = sum_{s <= t} Phi(t, s)[w, :] u(s),
Phi(t, s) = M_{t-1} ... M_s: one equation per received value (and per value of a colluder's own,
which it knows), the same for every coordinate of the model. `updates` says what the unknowns are:

* ``"once"``: gossip averaging of private values (u(0) = the values, no later update): the
  paper's first setting;
* ``"every_step"``: decentralized SGD, a fresh unknown update per peer and step, whatever the
  optimizer did (momentum, DP noise, adaptive steps: all inside u). Exactly, this leaves a
  non-neighbour undetermined on a ring: each of its contributions reaches the observer mixed with
  a neighbour's newer, unknown update;
* ``tie=k`` with ``"every_step"``: the paper's assumption for D-GD, each peer's update constant
  over windows of k steps (gradients change slowly): one unknown per window, so the system is
  determined far more often, and the least-squares solution is an approximation whose error
  against the truth says how well the assumption holds.

PowerGossip: a message on a compressed matrix is (M Q)^T or (M^T P)^T with Q, P the factors the two
ends of the edge share: a linear measurement of the sender's own matrix, with known coefficients
only on the observer's own edges. How that matrix evolves involves the factors of the sender's
other edges, built from models the observer never sees, so no equation with known coefficients
involves a non-neighbour's compressed matrices: the linear attack reaches them not at all, while
the tensors PowerGossip sends exactly (vectors, small matrices) obey the exact-gossip equations
above. `attackable_indices` says which tensors a view carries exactly.

Determinedness is structural (the topology, gamma, the steps, who colludes: all public), computed
by `knowledge_matrix` / `reach` before any run; `observations` reads the right-hand side from the
colluders' recorded views (`views`, ``observers: [...]``) and `solve` reconstructs. Numerics: the
row space comes from `network_dp._row_basis` (SVD, rank cut-off derived there); an unknown counts
as determined when the squared norm of its projection is within `DETERMINED_TOL` of 1.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from gossip_powersgd.privacy import network_dp

if TYPE_CHECKING:
    from topologies import AnyTopology

__all__ = [
    "DETERMINED_TOL",
    "UPDATES",
    "KnowledgeSystem",
    "attackable_indices",
    "colluders_for_all",
    "colluders_needed",
    "distances",
    "knowledge_matrix",
    "observations",
    "reach",
    "structure_report",
    "system_from_views",
]

UPDATES = ("once", "every_step")
#: An unknown (or a model) is determined when ||P_row e||^2 >= 1 - this (1e-12 cut-offs of the
#: SVD are far below it; a partly measured direction sits well away from 1).
DETERMINED_TOL = 1e-8


def _gamma(graphs, gamma: Optional[float]) -> float:
    """Exact gossip's: None is the topology's consensus step (1 on a schedule), as `resolve_gamma`."""
    import topologies

    if gamma is not None:
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        return float(gamma)
    return float(graphs.gamma) if isinstance(graphs, topologies.Topology) else 1.0


@dataclasses.dataclass
class KnowledgeSystem:
    """K u = y: `matrix` (rows x unknowns); `rows[k]` = (step, sender) of the value row k holds,
    `unknowns[c]` = (block, peer): peer's update of block `block` (a step, or a window of `tie`
    steps; block 0 only with ``updates="once"``)."""

    matrix: np.ndarray
    rows: List[Tuple[int, int]]
    unknowns: List[Tuple[int, int]]
    size: int
    steps: int
    tie: int
    phi: List[List[np.ndarray]]  # phi[t][s] = Phi(t, s), s <= t (blocks of every_step)
    updates: str

    def __post_init__(self):
        self._basis = None

    @property
    def basis(self) -> np.ndarray:
        """Orthonormal basis of K's row space (unknowns x rank)."""
        if self._basis is None:
            self._basis = network_dp._row_basis(self.matrix, self.steps, self.size)
        return self._basis

    def coefficients(self, peer: int, step: int) -> np.ndarray:
        """y_peer(step) - x0 as a combination of the unknowns."""
        row = np.zeros(len(self.unknowns))
        index = {u: c for c, u in enumerate(self.unknowns)}
        spans = range(step + 1) if self.updates == "every_step" else range(1)
        for s in spans:
            phi = self.phi[step][s]
            for j in range(self.size):
                row[index[(s // self.tie, j)]] += phi[peer, j]
        return row

    def determined(self, vectors: np.ndarray) -> np.ndarray:
        """Per row of `vectors` (combinations of the unknowns): whether K determines it."""
        vectors = np.atleast_2d(vectors)
        norms = (vectors**2).sum(axis=1)
        inside = ((vectors @ self.basis) ** 2).sum(axis=1)
        return inside >= (1.0 - DETERMINED_TOL) * norms

    def solve(self, values: np.ndarray) -> np.ndarray:
        """The minimum-norm least-squares u (unknowns x d) for observed `values` (rows x d)."""
        solution, *_ = np.linalg.lstsq(self.matrix, values, rcond=None)
        return solution

    def model(self, solution: np.ndarray, peer: int, step: int) -> np.ndarray:
        """The reconstruction of y_peer(step) - x0 from a `solve` solution."""
        return self.coefficients(peer, step) @ solution


def _check(topology: AnyTopology, steps: int, updates: str, tie: int):
    graphs = network_dp._graphs(topology)
    steps = network_dp._check_count("steps", steps, 1)
    tie = network_dp._check_count("tie", tie, 1)
    if updates not in UPDATES:
        raise ValueError(f"updates must be one of {', '.join(UPDATES)}, got {updates!r}")
    if updates == "once" and tie != 1:
        raise ValueError("tie is for updates='every_step' (windows of steps sharing an update)")
    return graphs, steps, tie


def _build(graphs, steps, value_rows, gamma, updates, tie) -> KnowledgeSystem:
    """The system of `value_rows` [(step, sender)]: y_sender(step) - x0 in the unknowns."""
    n = graphs.size
    blocks = -(-steps // tie) if updates == "every_step" else 1
    unknowns = [(b, j) for b in range(blocks) for j in range(n)]
    phi_t: List[np.ndarray] = [np.eye(n)]
    phi: List[List[np.ndarray]] = []
    for t in range(steps):
        if t > 0:
            m = network_dp.mixing_matrix(graphs, gamma, t - 1)
            phi_t = [m @ p for p in phi_t] + ([np.eye(n)] if updates == "every_step" else [])
        phi.append(phi_t)
    system = KnowledgeSystem(
        np.zeros((0, len(unknowns))), [], unknowns, n, steps, tie, phi, updates
    )
    rows = sorted(set(value_rows))
    system.matrix = np.array([system.coefficients(j, t) for t, j in rows]).reshape(
        len(rows), len(unknowns)
    )
    system.rows = rows
    return system


def knowledge_matrix(
    topology: AnyTopology,
    steps: int,
    colluders: Sequence[int],
    *,
    gamma: Optional[float] = None,
    updates: str = "every_step",
    tie: int = 1,
) -> KnowledgeSystem:
    """What `colluders` know after `steps` gossip steps: at every step each colluder's own value
    and the value of each of its neighbours of that step (a value two colluders receive counts
    once). `gamma` None: exact gossip's default (the topology's consensus step)."""
    graphs, steps, tie = _check(topology, steps, updates, tie)
    colluders = sorted({int(c) for c in colluders})
    if not colluders or not all(0 <= c < graphs.size for c in colluders):
        raise ValueError(f"colluders must be peers 0..{graphs.size - 1}, got {colluders}")
    rows = [
        (t, j) for t in range(steps) for c in colluders for j in (c, *graphs.at(t).neighbors(c))
    ]
    return _build(graphs, steps, rows, _gamma(graphs, gamma), updates, tie)


def reach(system: KnowledgeSystem) -> Dict[int, Dict[str, float]]:
    """Per peer: the fraction of its unknown updates the system determines (``"updates"``) and of
    its models y(t), t < steps, it determines (``"models"``), and whether its model at the last
    step is determined (``"last_model"``: 1.0 or 0.0)."""
    out = {}
    unit = np.eye(len(system.unknowns))
    for peer in range(system.size):
        columns = [c for c, (_, j) in enumerate(system.unknowns) if j == peer]
        updates = system.determined(unit[columns])
        models = system.determined(
            np.array([system.coefficients(peer, t) for t in range(system.steps)])
        )
        out[peer] = {
            "updates": float(updates.mean()),
            "models": float(models.mean()),
            "last_model": float(models[-1]),
        }
    return out


def colluders_needed(
    topology: AnyTopology,
    steps: int,
    target: int,
    *,
    gamma: Optional[float] = None,
    updates: str = "every_step",
    tie: int = 1,
    most: int = 3,
) -> Tuple[Optional[int], Tuple[int, ...]]:
    """The fewest colluders, none of them `target` or its neighbour, whose knowledge determines
    one of `target`'s private contributions (in averaging its value, in D-GD one of its
    updates), and the first such set in lexicographic order; (None, ()) if no set of at most
    `most` does. On a schedule a neighbour is a peer paired with `target` at any of the `steps`
    (a periodic schedule's whole period once `steps` covers it): each of them hears `target`'s
    values as sent."""
    graphs, steps, _ = _check(topology, steps, updates, tie)
    near = {target, *(j for t in range(steps) for j in graphs.at(t).neighbors(target))}
    candidates = [p for p in range(graphs.size) if p not in near]
    for k in range(1, most + 1):
        for group in itertools.combinations(candidates, k):
            system = knowledge_matrix(topology, steps, group, gamma=gamma, updates=updates, tie=tie)
            columns = [c for c, (_, j) in enumerate(system.unknowns) if j == target]
            if system.determined(np.eye(len(system.unknowns))[columns]).any():
                return k, group
    return None, ()


def colluders_for_all(
    topology: AnyTopology,
    steps: int,
    *,
    gamma: Optional[float] = None,
    updates: str = "every_step",
    tie: int = 1,
    most: int = 3,
) -> Tuple[Optional[int], Tuple[int, ...]]:
    """The fewest colluders (any peers) whose pooled knowledge determines every unknown of every
    peer, and the first such set in lexicographic order; (None, ()) if no set of at most `most`
    does."""
    size = network_dp._graphs(topology).size
    for k in range(1, most + 1):
        for group in itertools.combinations(range(size), k):
            system = knowledge_matrix(topology, steps, group, gamma=gamma, updates=updates, tie=tie)
            if system.determined(np.eye(len(system.unknowns))).all():
                return k, group
    return None, ()


def distances(topology: AnyTopology, source: int = 0) -> List[int]:
    """Graph distance (hops) from `source` to every peer of the static `topology`."""
    from gossip_powersgd.privacy.mechanisms.muffliato import hops

    return [int(d) for d in hops(topology, source)]


def _by_distance(far: Sequence[int], reached, key: str) -> Dict[str, List[int]]:
    """{distance: [determined, total]} over the peers at distance >= 1 from the observer."""
    out: Dict[str, List[int]] = {}
    for peer, d in enumerate(far):
        if d >= 1:
            cell = out.setdefault(str(d), [0, 0])
            cell[0] += int(reached[peer][key] == 1.0)
            cell[1] += 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def structure_report(
    topology: str, steps: int, *, updates: str = "every_step", tie: int = 1, most: int = 3
) -> Dict[str, Any]:
    """What peer 0 alone determines after `steps` steps on `topology` (a spec), per graph
    distance d: "updates_by_distance" / "models_by_distance" {d: [peers all of whose unknowns /
    models y(t) are determined, peers at d]}, "partly_by_distance" (peers some of whose unknowns
    are); the fewest colluders among the farthest peer's non-neighbours that determine one of its
    contributions ("colluders_for_target", "colluder_set_for_target": `colluders_needed`) and the
    fewest that determine everyone's ("colluders_for_all": `colluders_for_all`), searched up to
    `most`; the system's "rank" and "unknowns". No run: all of it is public structure."""
    far = distances(topology)
    system = knowledge_matrix(topology, steps, [0], updates=updates, tie=tie)
    reached = reach(system)
    target = far.index(max(far))
    k_target, group_target = colluders_needed(
        topology, steps, target, updates=updates, tie=tie, most=most
    )
    k_all, group_all = colluders_for_all(topology, steps, updates=updates, tie=tie, most=most)
    partly = {
        str(d): sum(1 for p, dp in enumerate(far) if dp == d and 0 < reached[p]["updates"] < 1)
        for d in sorted(set(far))
        if d >= 1
    }
    return {
        "topology": topology,
        "steps": steps,
        "updates": updates,
        "tie": tie,
        "peers": len(far),
        "neighbours": sum(1 for d in far if d == 1),
        "rank": int(system.basis.shape[1]),
        "unknowns": len(system.unknowns),
        "updates_by_distance": _by_distance(far, reached, "updates"),
        "models_by_distance": _by_distance(far, reached, "models"),
        "partly_by_distance": partly,
        "target": target,
        "target_distance": far[target],
        "colluders_for_target": k_target,
        "colluder_set_for_target": list(group_target),
        "colluders_for_all": k_all,
        "colluder_set_for_all": list(group_all),
        "most": most,
    }


# ---- from recorded views ---------------------------------------------------------------------------


def attackable_indices(view) -> List[int]:
    """The parameter indices every message of `view` that carries any exactly carries in full
    (exact gossip: all; PowerGossip: the tensors it gossips exactly)."""
    found = None
    for record in view.records:
        for message in record["messages"]:
            for part in view.decode(dict(message, step=record["step"])):
                if part.kind == "model":
                    found = set(part.indices) if found is None else found & set(part.indices)
    return sorted(found or [])


def flat(tensors: Sequence[torch.Tensor], indices: Sequence[int]) -> np.ndarray:
    """The parameters `indices` of `tensors` as one float64 vector (empty for no indices)."""
    if not indices:
        return np.zeros(0)
    return torch.cat([tensors[k].detach().double().reshape(-1) for k in indices]).numpy()


def system_from_views(
    views: Mapping[int, object],
    topology: AnyTopology,
    *,
    gamma: Optional[float] = None,
    updates: str = "every_step",
    tie: int = 1,
) -> KnowledgeSystem:
    """The system of exactly what the colluders' recorded `views` ({colluder: ObservedView})
    hold: their own values at the recorded steps and every value received in a "model" part."""
    graphs = network_dp._graphs(topology)
    steps = 1 + max(max(view.steps) for view in views.values())
    _, steps, tie = _check(graphs, steps, updates, tie)
    rows = []
    for colluder, view in views.items():
        for record in view.records:
            rows.append((record["step"], int(colluder)))
            for message in record["messages"]:
                parts = view.decode(dict(message, step=record["step"]))
                if any(p.kind == "model" for p in parts):
                    rows.append((record["step"], int(message["sender"])))
    return _build(graphs, steps, rows, _gamma(graphs, gamma), updates, tie)


def observations(
    system: KnowledgeSystem,
    views: Mapping[int, object],
    initial: Sequence[torch.Tensor],
    indices: Sequence[int],
) -> np.ndarray:
    """The right-hand side y (rows x d): for each row (step, sender) of `system`, the value the
    views hold of it (a colluder's own, or as received) minus the common `initial` model, on the
    parameters `indices` (`attackable_indices`)."""
    x0 = flat(initial, indices)
    known: Dict[Tuple[int, int], np.ndarray] = {}
    for colluder, view in views.items():
        for record in view.records:
            t = record["step"]
            known[(t, int(colluder))] = flat(record["own"], indices) - x0
            for message in record["messages"]:
                for part in view.decode(dict(message, step=t)):
                    if part.kind == "model" and set(indices) <= set(part.indices):
                        values = [part.values[part.indices.index(k)] for k in indices]
                        known[(t, int(message["sender"]))] = (
                            torch.cat([v.double().reshape(-1) for v in values]).numpy() - x0
                        )
    missing = [row for row in system.rows if row not in known]
    if missing:
        raise ValueError(
            f"the views hold no value for rows {missing[:3]}: build the system from them"
        )
    return np.stack([known[row] for row in system.rows])
