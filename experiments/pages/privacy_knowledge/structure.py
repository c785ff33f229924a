"""The structural rows: which peers one curious peer determines, and how many colluders it takes.

No training: determinedness depends only on public facts (the topology, γ, the number of gossip
steps, who colludes, what the unknowns are), so `privacy.knowledge.knowledge_matrix` and `reach`
answer it before any run. One row per (topology, updates, tie, steps).
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: The curious peer of the single-observer rows.
OBSERVER = 0


def distances(spec: str, source: int = OBSERVER) -> List[int]:
    """Graph distance (hops) from `source` to every peer of the static topology `spec`."""
    import topologies

    graph = topologies.parse(spec)
    far = [-1] * graph.size
    far[source] = 0
    frontier = [source]
    while frontier:
        nxt = []
        for p in frontier:
            for q in graph.neighbors(p):
                if far[q] < 0:
                    far[q] = far[p] + 1
                    nxt.append(q)
        frontier = nxt
    return far


def _mode(updates: str, tie: int) -> Dict[str, Any]:
    return {"updates": updates, "tie": tie}


def every_peer_determined(system) -> bool:
    """Whether `system` determines every unknown of every peer."""
    return bool(system.determined(np.eye(len(system.unknowns))).all())


def colluders_for_target(
    spec: str, steps: int, target: int, updates: str, tie: int, most: int
) -> Tuple[Optional[int], Tuple[int, ...]]:
    """`privacy.knowledge.colluders_needed` (the fewest colluders, none of them `target` or its
    neighbour, that determine one of its contributions), checking the target's unknowns only."""
    from gossip_powersgd.privacy.knowledge import knowledge_matrix

    import topologies

    graph = topologies.parse(spec)
    near = {target, *graph.neighbors(target)}
    candidates = [p for p in range(graph.size) if p not in near]
    for k in range(1, most + 1):
        for group in itertools.combinations(candidates, k):
            system = knowledge_matrix(spec, steps, group, updates=updates, tie=tie)
            columns = [c for c, (_, j) in enumerate(system.unknowns) if j == target]
            if system.determined(np.eye(len(system.unknowns))[columns]).any():
                return k, group
    return None, ()


def colluders_for_everyone(
    spec: str, steps: int, updates: str, tie: int, most: int
) -> Tuple[Optional[int], Tuple[int, ...]]:
    """The fewest colluders (any peers) whose pooled knowledge determines every unknown of every
    peer, and the first such set in lexicographic order; (None, ()) if no set of at most `most`."""
    from gossip_powersgd.privacy.knowledge import knowledge_matrix

    import topologies

    size = topologies.parse(spec).size
    for k in range(1, most + 1):
        for group in itertools.combinations(range(size), k):
            system = knowledge_matrix(spec, steps, group, updates=updates, tie=tie)
            if every_peer_determined(system):
                return k, group
    return None, ()


def _by_distance(far: Sequence[int], reached: Dict[int, Dict[str, float]], key: str):
    """{distance: [determined, total]} over the peers at distance >= 1 from the observer."""
    out: Dict[str, List[int]] = {}
    for peer, d in enumerate(far):
        if d < 1:
            continue
        cell = out.setdefault(str(d), [0, 0])
        cell[0] += int(reached[peer][key] == 1.0)
        cell[1] += 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def structure_row(config: Dict[str, Any]) -> Dict[str, Any]:
    """One (topology, updates, tie, steps): what peer 0 alone determines, per graph distance
    (its private values / updates, and its models y(t)); the fewest non-neighbour colluders that
    determine one contribution of the farthest peer; the fewest colluders that determine every
    peer's every contribution."""
    from gossip_powersgd.privacy.knowledge import knowledge_matrix, reach

    spec, steps = config["topology"], config["steps"]
    updates, tie, most = config["updates"], config["tie"], config["most"]
    far = distances(spec)
    system = knowledge_matrix(spec, steps, [OBSERVER], updates=updates, tie=tie)
    reached = reach(system)
    target = far.index(max(far))
    k_target, group_target = colluders_for_target(spec, steps, target, updates, tie, most)
    k_all, group_all = colluders_for_everyone(spec, steps, updates, tie, most)
    return {
        "topology": spec,
        "steps": steps,
        **_mode(updates, tie),
        "peers": len(far),
        "neighbours": sum(1 for d in far if d == 1),
        "rank": int(system.basis.shape[1]),
        "unknowns": len(system.unknowns),
        "updates_by_distance": _by_distance(far, reached, "updates"),
        "models_by_distance": _by_distance(far, reached, "models"),
        "partly_by_distance": {
            str(d): sum(1 for p, dp in enumerate(far) if dp == d and 0 < reached[p]["updates"] < 1)
            for d in sorted(set(far))
            if d >= 1
        },
        "target": target,
        "target_distance": far[target],
        "colluders_for_target": k_target,
        "colluder_set_for_target": list(group_target),
        "colluders_for_all": k_all,
        "colluder_set_for_all": list(group_all),
        "most": most,
    }
