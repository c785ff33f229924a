"""Each mechanism's noise for epsilon = TARGET against a direct neighbour (victim 1, observer 0;
the topologies are vertex transitive), with that mechanism's own valid accountant, and the
epsilons that noise gives: against the neighbour (RDP, and PLD from dp-accounting), the most
distant peer, and a peer knowing everything it can.

DP-SGD (local): the subsampled Gaussian, the same epsilon against every peer. Muffliato and ZIP-DL:
min(local, network view) where the network view applies (constant lr: `muffliato.network_applies`),
the view over the first T steps (T doubled from NETWORK_STEPS until it settles the minimum: a
prefix's epsilon is a lower bound on the whole run's), else DP-SGD's local bound. DECOR: SecLDP,
its noise on the gradient sum (valid under any lr schedule)."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:
    from topologies import Topology

DELTA, CLIP, TARGET = 1e-5, 1.0, 4.0
#: DECOR's sigma_cor / sigma_ind, fixed before any run (not tuned on accuracy).
DECOR_RATIO = 4.0
#: ZIP-DL's per-draw std over DP-SGD's noise std on the model (`zipdl.noise_ratio`), fixed before
#: any run: its zero-sum noise as large as the DP noise of one step.
ZIPDL_RATIO = 1.0
#: The network bound is computed on the view of the first NETWORK_STEPS steps (a lower bound on
#: the whole run's: the view only grows), doubled until it settles the minimum with DP-SGD's
#: bound, or up to the whole run (the exact view of a 16-peer graph over 512 steps takes minutes).
NETWORK_STEPS = 128


def _rdp(sigma: float, q: float, steps: int) -> float:
    from gossip_powersgd.privacy.accounting import epsilon, make_accountant

    check = make_accountant("rdp")
    check.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return epsilon(check, DELTA)


def calibrate(setting: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """{mechanism: its noise (sigma, extra noise) and epsilons} on `setting`'s topology."""
    import topologies

    from gossip_powersgd.privacy.accounting import noise_for_target, pld_epsilon
    from gossip_powersgd.privacy.mechanisms import muffliato

    topology = topologies.parse(setting["topology"])
    far = int(max(range(topology.size), key=lambda u: muffliato.hops(topology, 0)[u]))
    q = setting["batch_size"] / setting["shard"]
    steps = setting["epochs"] * math.ceil(setting["shard"] / setting["batch_size"])
    local_sigma = noise_for_target(TARGET, DELTA, [q], steps, "rdp")
    rdp = _rdp(local_sigma, q, steps)
    out = {"local": dict(sigma=local_sigma, extra="—", neighbour=rdp, far=rdp)}
    out["local"].update(neighbour_pld=pld_epsilon([(local_sigma, q, steps)], DELTA), local=rdp)
    out["local"]["note"] = "DP-SGD: the same epsilon against every peer"
    zip_sigma = ZIPDL_RATIO * setting["lr"] * local_sigma * CLIP / setting["batch_size"]
    if not muffliato.network_applies("exact", 0.0, setting["schedule"], 0.0):
        # The network figures are no guarantee for training (muffliato.NETWORK_LABEL): the
        # local bound is the epsilon, under any schedule.
        why = (
            "local bound only: the network view is no guarantee for training (adaptive "
            f"gradients, the evaluation's release); this run's lr is {setting['schedule']}"
        )
        out["muffliato"] = dict(out["local"], note=f"{why} (same noise as DP-SGD)")
        out["zipdl"] = dict(
            out["local"],
            extra=f"zero-sum std {zip_sigma:.3g} per draw",
            zipdl_sigma=zip_sigma,
            note=f"{why}; the zero-sum noise is extra noise on the messages",
        )
    else:
        for name, ratio in (("muffliato", 0.0), ("zipdl", ZIPDL_RATIO)):
            out[name] = _network_row(name, ratio, topology, far, q, steps, local_sigma, setting)
    out["decor"] = _decor_row(topology, q, steps, far)
    for row in out.values():
        row.update(q=q, steps=steps, far_peer=far)
    return out


def _network_row(
    name, zero_sum, topology: Topology, far, q, steps, local_sigma, setting
) -> Dict[str, Any]:
    """Muffliato's (zero_sum 0) or ZIP-DL's row: sigma for TARGET against the neighbour with
    epsilon = min(local, network view), the view's leakage over the first T steps (T doubled from
    NETWORK_STEPS until its network bound at DP-SGD's sigma is above DP-SGD's epsilon for the
    neighbour and the most distant peer, or T is the whole run)."""
    from gossip_powersgd.privacy import network_dp
    from gossip_powersgd.privacy.accounting import pld_epsilon
    from gossip_powersgd.privacy.mechanisms import muffliato

    def eps(leak, sigma, u):
        net = float(network_dp.gaussian_epsilon(math.sqrt(leak[u]) / sigma, DELTA))
        return min(_rdp(sigma, q, steps), net), net

    span, local = min(steps, NETWORK_STEPS), _rdp(local_sigma, q, steps)
    while True:
        leak = muffliato.network_leakage(topology, span, observer=0, zero_sum=zero_sum)
        if span == steps or min(eps(leak, local_sigma, u)[1] for u in (1, far)) >= local:
            break
        span = min(steps, 2 * span)
    lo, hi = 0.05, local_sigma  # the min is <= local: sigma <= local_sigma reaches the target
    if eps(leak, hi, 1)[1] < _rdp(hi, q, steps):  # the network bound is the better one
        while hi / lo > 1.001:
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if eps(leak, mid, 1)[0] > TARGET else (lo, mid)
    (nb, nb_net), (fa, fa_net) = eps(leak, hi, 1), eps(leak, hi, far)
    bound = "network bound alone" + (
        f" (view of the first {span} steps: a lower bound)" if span < steps else ""
    )
    sign = "≥ " if span < steps else ""
    zip_sigma = ZIPDL_RATIO * setting["lr"] * hi * CLIP / setting["batch_size"]
    what = "network view" if name == "muffliato" else "network view with the zero-sum noise"
    row = dict(sigma=hi, extra="—", neighbour=nb, far=fa)
    row.update(neighbour_pld=pld_epsilon([(hi, q, steps)], DELTA), local=_rdp(hi, q, steps))
    row.update(network_neighbour=nb_net, network_far=fa_net)
    row["note"] = (
        f"min(local, {what}); {bound}: neighbour {sign}{nb_net:.3g}, peer {far} hops away "
        f"{sign}{fa_net:.3g} (exact gossip only; PowerGossip: local)"
    )
    if name == "zipdl":
        row.update(extra=f"zero-sum std {zip_sigma:.3g} per draw", zipdl_sigma=zip_sigma)
    return dict(row, network_steps=span)


def _decor_row(topology: Topology, q: float, steps: int, far: int) -> Dict[str, Any]:
    """DECOR's row: SecLDP, its noise on the gradient sum (valid under any lr schedule)."""
    from gossip_powersgd.privacy.mechanisms import decor

    adjacency = decor.adjacency_of(topology)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        s_ind = decor.sigma_ind_for_target(
            TARGET, adjacency, DECOR_RATIO, q, steps, DELTA, [(1, 0)]
        )
        s_cor = DECOR_RATIO * s_ind

        def eps(u, accountant="rdp"):
            return decor.secldp_epsilon(adjacency, s_ind, s_cor, u, 0, q, steps, DELTA, accountant)

        row = dict(sigma=s_ind, extra=f"sigma_cor {s_cor:.3g} per pair", sigma_cor=s_cor)
        row.update(neighbour=eps(1), far=eps(far), neighbour_pld=eps(1, "pld"))
    row.update(local=_rdp(s_ind, q, steps))
    row["note"] = (
        "SecLDP; 'local' = against a peer holding all the victim's pair keys (sigma_ind alone)"
    )
    return row
