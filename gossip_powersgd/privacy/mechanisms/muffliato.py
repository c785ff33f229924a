"""Muffliato in training: Gaussian noise on each local update once, gossip mixes it; pairwise
accounting.

Cyffers, Even, Bellet, Massoulié, "Muffliato: Peer-to-Peer Privacy Amplification for Decentralized
Optimization and Averaging", NeurIPS 2022. The mechanism is DP-SGD's noise on each peer's own
clipped gradient sum (`dpsgd`: std sigma C, from the peer's secret keystream), added once per
local update, before the optimizer step; the gossip step that follows mixes it with the
neighbours'. No noise is added to the messages. What differs from local DP-SGD is the accounting,
per pair (victim u, observer v), and the better of two valid bounds is reported:

* local: DP-SGD's epsilon (Poisson subsampling at q, T steps): holds against any observer, for
  every algorithm, since every message is post-processing of the noisy updates;
* network (exact gossip only): observer v's whole view of the run, as `network_dp` computes it
  exactly (noise every step, any per-step record change ||delta_s|| <= C): a single Gaussian
  mechanism of sensitivity mu = sqrt(l_uv) / sigma, converted exactly. It does not use
  subsampling (the view mixes several steps' noise; amplification by subsampling of that joint
  mechanism is not covered), and it models plain SGD with a constant learning rate (the update of
  step s enters the model once, with a fixed scale): with momentum or a changing learning rate
  only the local bound is used. PowerGossip's messages are non-linear in the models: local only.

So epsilon_uv = min(local, network). Against a direct neighbour, which receives x_u itself at every
step, the network bound is close to the local bound without subsampling, above the subsampled one:
Muffliato's gain is against peers further away.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict

import numpy as np

from gossip_powersgd.privacy import network_dp

if TYPE_CHECKING:
    from topologies import AnyTopology

__all__ = ["network_leakage", "muffliato_epsilons", "network_applies", "epsilon_note"]


def network_applies(algorithm: str, momentum: float, schedule: str, warmup_epochs: float) -> bool:
    """Whether the network bound models the run: exact gossip, plain SGD, constant step size."""
    return (
        algorithm == "exact"
        and float(momentum) == 0.0
        and schedule == "constant"
        and float(warmup_epochs) == 0.0
    )


def _not_modelled(config) -> list:
    """What of the run `network_applies` does not model, in the config's words."""
    reasons = []
    algorithm = str(config.algorithm).split(":", 1)[0].strip()
    if algorithm != "exact":
        reasons.append(f"algorithm {algorithm}")
    if float(config.momentum) != 0.0:
        reasons.append(f"momentum {config.momentum:g}")
    if config.schedule != "constant":
        reasons.append(f"schedule {config.schedule}")
    if float(config.warmup_epochs) != 0.0:
        reasons.append(f"warmup_epochs {config.warmup_epochs:g}")
    return reasons


def epsilon_note(config) -> tuple:
    """(what a muffliato run's epsilon means, a warning line or None): the run reports DP-SGD's
    local bound, valid for any algorithm and optimizer (every message is post-processing of the
    noisy updates); the pairwise network bound (`muffliato_epsilons`) models exact gossip with
    plain SGD at a constant learning rate, so a run with momentum or a changing step gets no
    amplification claim, and says so."""
    note = (
        "DP-SGD's local bound, valid against every observer (every message is post-processing "
        "of the noisy updates)"
    )
    reasons = _not_modelled(config)
    if not reasons:
        return (
            note + "; Muffliato's pairwise network bound (muffliato_epsilons) may be lower "
            "against peers further away",
            None,
        )
    what = ", ".join(reasons)
    note += (
        f"; Muffliato's pairwise network bound does not apply to this run ({what}): it models "
        "exact gossip with plain SGD at a constant learning rate"
    )
    warning = (
        f"dp_mechanism: muffliato with {what}: its network bound models exact gossip with plain "
        "SGD at a constant learning rate, so the run's epsilon is the local DP-SGD bound only "
        "(valid against every observer, no amplification by the gossip)"
    )
    return note, warning


def network_leakage(
    topology: AnyTopology, steps: int, observer: int, gamma: float = 1.0, zero_sum: float = 0.0
) -> Dict[int, float]:
    """{u: l_uv}: observer v's squared mean shift per unit C of peer u's record over `steps` noisy
    steps of exact gossip (`network_dp`'s exact view, noise every step, any per-step shift); the
    Gaussian mechanism's mu is sqrt(l) / sigma. Only observer v's view is built (n - 1 pairs).
    `zero_sum`: ZIP-DL's per-edge noise on the messages, its std over DP-SGD's in the same units
    (`zipdl.noise_ratio`); 0 without ZIP-DL."""
    graphs = network_dp._graphs(topology)
    zero_sum = network_dp._check_ratio(zero_sum)
    grams = network_dp._grams(
        graphs, int(steps), int(observer), "every_step", float(gamma), zero_sum
    )
    peers = sorted(grams)
    values = network_dp._leakage([grams[u] for u in peers], "any")
    out = {u: 0.0 for u in range(graphs.size) if u != observer}
    out.update({u: float(min(max(v, 0.0), steps)) for u, v in zip(peers, values)})
    return out


def muffliato_epsilons(
    topology: AnyTopology,
    steps: int,
    sigma: float,
    sample_rate: float,
    delta: float,
    observer: int,
    *,
    network: bool,
    gamma: float = 1.0,
    zero_sum: float = 0.0,
) -> Dict[int, dict]:
    """{u: {"local", "network", "epsilon"}} towards `observer`: DP-SGD's subsampled epsilon (RDP,
    Opacus), the network bound (NaN when `network` is False) and their minimum. `zero_sum`: ZIP-DL's
    noise ratio (`network_leakage`; `zipdl.zipdl_epsilons` passes it)."""
    from gossip_powersgd.privacy.accounting import epsilon, make_accountant

    check = make_accountant("rdp")
    check.history = [(float(sigma), float(sample_rate), int(steps))]
    local = epsilon(check, delta)
    n = network_dp._graphs(topology).size
    leak = network_leakage(topology, steps, observer, gamma, zero_sum) if network else {}
    out = {}
    for u in range(n):
        if u == observer:
            continue
        net = (
            float(network_dp.gaussian_epsilon(math.sqrt(leak[u]) / sigma, delta))
            if network
            else math.nan
        )
        out[u] = {
            "local": local,
            "network": net,
            "epsilon": local if math.isnan(net) else min(local, net),
        }
    return out


def hops(topology: AnyTopology, source: int) -> np.ndarray:
    """Graph distance from `source` to every peer (breadth first)."""
    w = np.asarray(network_dp._graphs(topology).at(0).W)
    n = w.shape[0]
    dist = np.full(n, -1)
    dist[source] = 0
    frontier = [source]
    while frontier:
        nxt = []
        for a in frontier:
            for b in range(n):
                if b != a and w[a, b] != 0 and dist[b] < 0:
                    dist[b] = dist[a] + 1
                    nxt.append(b)
        frontier = nxt
    return dist
