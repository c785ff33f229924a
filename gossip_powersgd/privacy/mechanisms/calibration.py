"""Each mechanism's noise for a target epsilon against a direct neighbour, with that mechanism's own
valid accountant, and the epsilons that noise gives.

    noises = calibrate("ring:8", batch_size=64, shard=1000, epochs=512, lr=0.5,
                       schedule="cosine", target=4.0, delta=1e-5, clip=1.0)
    noises["decor"]["sigma"], noises["decor"]["sigma_cor"]   # dp_noise_multiplier, ..._sigma_cor

Victim 1 against observer 0 (the topologies of interest are vertex transitive); every peer holds
`shard` records and samples them by Poisson sampling at q = batch_size / shard for epochs x
ceil(shard / batch_size) steps. Per mechanism (its row: "sigma", "extra" noise in words, the
epsilon against the neighbour by RDP ("neighbour") and by dp-accounting's PLD
("neighbour_pld"), against the most distant peer ("far", "far_peer"), against a peer knowing
everything it can ("local"), "q", "steps" and a "note" naming the accountant):

* ``local`` (DP-SGD): the subsampled Gaussian, the same epsilon against every peer;
* ``muffliato`` and ``zipdl``: DP-SGD's noise and its local bound, since their network figures are
  no guarantee for training (`muffliato.network_applies`); ZIP-DL's zero-sum noise on the messages
  ("zipdl_sigma") is `zipdl_ratio` times one step's DP noise on the model at the base lr;
* ``decor``: SecLDP (`decor.secldp_epsilon`), sigma_ind solved for the target with sigma_cor =
  `decor_ratio` sigma_ind ("sigma_cor"); its noise is on the gradient sum, valid under any schedule.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Optional

__all__ = ["calibrate", "subsampled_epsilon"]


def subsampled_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """DP-SGD's epsilon (RDP accountant) after `steps` subsampled Gaussian steps at rate q."""
    from gossip_powersgd.privacy.accounting import epsilon, make_accountant

    check = make_accountant("rdp")
    check.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return epsilon(check, delta)


def calibrate(
    topology: str,
    batch_size: int,
    shard: int,
    epochs: int,
    lr: float,
    schedule: str,
    *,
    target: float,
    delta: float,
    clip: float,
    decor_ratio: float = 4.0,
    zipdl_ratio: float = 1.0,
    steps: Optional[int] = None,
) -> Dict[str, Dict[str, Any]]:
    """{mechanism: its noise and epsilons} for `target` against a neighbour (module docstring).
    `steps`: the run's number of steps where an epoch is not a pass over `shard` (the victim
    trains on fewer records than an epoch counts); default epochs x ceil(shard / batch_size)."""
    import topologies

    from gossip_powersgd.privacy.accounting import noise_for_target, pld_epsilon
    from gossip_powersgd.privacy.mechanisms import muffliato

    graph = topologies.parse(topology)
    far = int(max(range(graph.size), key=lambda u: muffliato.hops(graph, 0)[u]))
    q = batch_size / shard
    steps = steps or epochs * math.ceil(shard / batch_size)
    local_sigma = noise_for_target(target, delta, [q], steps, "rdp")
    rdp = subsampled_epsilon(local_sigma, q, steps, delta)
    out = {"local": dict(sigma=local_sigma, extra="—", neighbour=rdp, far=rdp)}
    out["local"].update(neighbour_pld=pld_epsilon([(local_sigma, q, steps)], delta), local=rdp)
    out["local"]["note"] = "DP-SGD: the same epsilon against every peer"
    zip_sigma = zipdl_ratio * lr * local_sigma * clip / batch_size
    why = (
        "local bound only: the network view is no guarantee for training (adaptive "
        f"gradients, the evaluation's release); this run's lr is {schedule}"
    )
    out["muffliato"] = dict(out["local"], note=f"{why} (same noise as DP-SGD)")
    out["zipdl"] = dict(
        out["local"],
        extra=f"zero-sum std {zip_sigma:.3g} per draw",
        zipdl_sigma=zip_sigma,
        note=f"{why}; the zero-sum noise is extra noise on the messages",
    )
    out["decor"] = _decor(graph, q, steps, far, target, delta, decor_ratio)
    for row in out.values():
        row.update(q=q, steps=steps, far_peer=far)
    return out


def _decor(graph, q, steps, far, target, delta, ratio) -> Dict[str, Any]:
    """DECOR's row: SecLDP, its noise on the gradient sum (valid under any lr schedule)."""
    from gossip_powersgd.privacy.mechanisms import decor

    adjacency = decor.adjacency_of(graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        s_ind = decor.sigma_ind_for_target(target, adjacency, ratio, q, steps, delta, [(1, 0)])
        s_cor = ratio * s_ind

        def eps(u, accountant="rdp"):
            return decor.secldp_epsilon(adjacency, s_ind, s_cor, u, 0, q, steps, delta, accountant)

        row = dict(sigma=s_ind, extra=f"sigma_cor {s_cor:.3g} per pair", sigma_cor=s_cor)
        row.update(neighbour=eps(1), far=eps(far), neighbour_pld=eps(1, "pld"))
    row.update(local=subsampled_epsilon(s_ind, q, steps, delta))
    row["note"] = (
        "SecLDP; 'local' = against a peer holding all the victim's pair keys (sigma_ind alone)"
    )
    return row
