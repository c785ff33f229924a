"""Muffliato in training: Gaussian noise on each local update once, gossip mixes it; pairwise
accounting.

Cyffers, Even, Bellet, Massoulié, "Muffliato: Peer-to-Peer Privacy Amplification for Decentralized
Optimization and Averaging", NeurIPS 2022. The mechanism is DP-SGD's noise on each peer's own
clipped gradient sum (`dpsgd`: std sigma C, from the peer's secret keystream), added once per
local update, before the optimizer step; the gossip step that follows mixes it with the
neighbours'. No noise is added to the messages. Two figures per pair (victim u, observer v):

* local: DP-SGD's epsilon (Poisson subsampling at q, T steps): holds against any observer, for
  every algorithm, since every message is post-processing of the noisy updates. This is the
  guarantee (``"epsilon"``, labelled ``ε (local DP-SGD, add/remove; Opacus RDP)``);
* network (exact gossip only): observer v's whole view of the run, as `network_dp` computes it
  exactly (noise every step, any per-step record change ||delta_s|| <= C): a single Gaussian
  mechanism of sensitivity mu = sqrt(l_uv) / sigma, converted exactly. It is NOT a guarantee for
  training (``"network"``, labelled `NETWORK_LABEL`): it takes each step's contribution as fixed
  in advance, while DP-SGD's gradients depend on the noisy models the observer has seen
  (adaptive composition; a star:4 counter-example moves 0.868 to 2.0-2.9), and it ignores the
  evaluation, which all-reduces the average model to every peer (the threat-model page's
  ring:16 figure 0.062 becomes 1.18 with it). It is kept for comparison with the literature and for
  non-adaptive linear gossip, where it is exact (`network_dp`).

So epsilon_uv is the local bound; a smaller network figure beside it is no smaller guarantee.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict

import numpy as np

from gossip_powersgd.privacy import network_dp
from gossip_powersgd.privacy.accounting import (
    ADD_REMOVE,
    ADJACENCY_SHORT,
    NETWORK_LABEL,
    REPLACE_ONE,
    epsilon_label,
)
from gossip_powersgd.privacy.mechanisms.registry import Mechanism, register_mechanism

if TYPE_CHECKING:
    from topologies import AnyTopology

__all__ = [
    "network_leakage",
    "muffliato_epsilons",
    "network_applies",
    "epsilon_note",
    "NETWORK_LABEL",
]


def network_applies(algorithm: str, momentum: float, schedule: str, warmup_epochs: float) -> bool:
    """Whether the network bound is a guarantee for a training run: never (see the module
    docstring: adaptive gradients, the evaluation's release), whatever the algorithm, momentum
    or schedule; callers that took min(local, network) where this was True get the local bound."""
    return False


def _not_modelled(config) -> list:
    """What of the run the network figure would not model even for non-adaptive updates."""
    reasons = []
    algorithm = config.algorithm_spec.name
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
    noisy updates); the pairwise network figure (`muffliato_epsilons`) is `NETWORK_LABEL`, no
    guarantee for training, and is not reported. A run it would not model even without adaptive
    gradients (momentum, a changing step, another algorithm) is warned about by name."""
    released = bool(getattr(config, "release_peer_statistics", False))
    adjacency = ADJACENCY_SHORT[REPLACE_ONE if released else ADD_REMOVE]
    note = (
        "DP-SGD's local bound, valid against every observer (every message is post-processing "
        f"of the noisy updates): ε (local DP-SGD, {adjacency}); Muffliato's pairwise figure is a "
        f"{NETWORK_LABEL}, not reported"
    )
    reasons = _not_modelled(config)
    if not reasons:
        return note, None
    what = ", ".join(reasons)
    note += f"; it would not model this run's {what} either"
    warning = (
        f"dp_mechanism: muffliato with {what}: the run's epsilon is the local DP-SGD bound only "
        "(valid against every observer, no amplification by the gossip); Muffliato's network "
        "bound is not valid for adaptive training in any case"
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
    """{u: {"local", "network", "epsilon", "epsilon_label", "network_label"}} towards
    `observer`: DP-SGD's subsampled epsilon (RDP, Opacus), the network figure (NaN when `network`
    is False; `NETWORK_LABEL`: not a guarantee for training) and the guarantee, ``"epsilon"`` =
    the local bound. `zero_sum`: ZIP-DL's noise ratio (`network_leakage`; `zipdl.zipdl_epsilons`
    passes it)."""
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
            "epsilon": local,
            "epsilon_label": epsilon_label(ADD_REMOVE, "rdp"),
            "network_label": NETWORK_LABEL,
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


@register_mechanism
class Muffliato(Mechanism):
    name = "muffliato"
    summary = (
        "DP-SGD's noise; its per-pair network figure is no guarantee for training, the epsilon "
        "is DP-SGD's"
    )
    needs = "supports_update_noise"
    network_bound = True

    def epsilon_note(self, config):
        return epsilon_note(config)
