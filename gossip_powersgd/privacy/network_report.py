"""The pairwise network DP of noisy exact gossip on one topology, summarised beside its bounds.

`pairwise_report(topology, steps, sigma, delta, noise)` is `network_dp.pairwise_epsilon`'s exact
epsilon[u, v] (peer u towards observer v's whole view) with, over the pairs u != v, its minimum,
median and maximum and the share of pairs at the local-DP ceiling (`network_dp.local_epsilon`:
what u's own noisy values reveal). With noise once it also converts Muffliato's per-message sum
(`network_dp.per_message_composition_rdp`, every message composed as if it carried fresh noise) the
same way and says how often that sum is below the exact epsilon or above the ceiling: it is not a
bound.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

__all__ = ["pairwise_report"]


def pairwise_report(
    topology: str, steps: int, sigma: float, delta: float, noise: str = "once"
) -> Dict[str, Any]:
    """{"topology", "noise", "steps", "matrix" (epsilon[u][v]), "min", "median", "max" (over
    u != v), "local" (the ceiling), "at_local" (share of pairs within 1e-9 of it)}; with noise
    "once" also "per_message_min", "per_message_max", "per_message_below_exact",
    "per_message_above_local" (module docstring). Sensitivity 1."""
    import topologies

    from gossip_powersgd.privacy import network_dp as net

    ceiling = net.local_epsilon(steps, sigma, delta, noise=noise)
    eps = net.pairwise_epsilon(topology, steps, sigma, delta, noise=noise)
    mask = ~np.eye(len(eps), dtype=bool)
    off = eps[mask]
    out = dict(topology=topology, noise=noise, steps=steps, matrix=eps.tolist())
    out.update(min=float(off.min()), median=float(np.median(off)), max=float(off.max()))
    out.update(local=ceiling, at_local=float(np.isclose(off, ceiling, 1e-9, 0).mean()))
    if noise == "once":
        rho = net.per_message_composition_rdp(topologies.parse(topology), steps, sigma)
        summed = net.gaussian_epsilon(np.sqrt(2 * rho[mask]), delta)
        out["per_message_min"] = float(summed.min())
        out["per_message_max"] = float(summed.max())
        out["per_message_below_exact"] = float((summed < off * (1 - 1e-9)).mean())
        out["per_message_above_local"] = float((summed > ceiling * (1 + 1e-9)).mean())
    return out
