"""The structural rows: which peers one curious peer determines, and how many colluders it takes.

No training: determinedness depends only on public facts (the topology, γ, the number of gossip
steps, who colludes, what the unknowns are), so `privacy.knowledge.knowledge_matrix` and `reach`
answer it before any run. One row per (topology, updates, tie, steps).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from gossip_powersgd.privacy.knowledge_attack import distances

#: The curious peer of the single-observer rows.
OBSERVER = 0


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
    from gossip_powersgd.privacy.knowledge import (
        colluders_for_all,
        colluders_needed,
        knowledge_matrix,
        reach,
    )

    spec, steps = config["topology"], config["steps"]
    updates, tie, most = config["updates"], config["tie"], config["most"]
    far = distances(spec)
    system = knowledge_matrix(spec, steps, [OBSERVER], updates=updates, tie=tie)
    reached = reach(system)
    target = far.index(max(far))
    mode = dict(updates=updates, tie=tie, most=most)
    k_target, group_target = colluders_needed(spec, steps, target, **mode)
    k_all, group_all = colluders_for_all(spec, steps, **mode)
    return {
        "topology": spec,
        "steps": steps,
        "updates": updates,
        "tie": tie,
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
