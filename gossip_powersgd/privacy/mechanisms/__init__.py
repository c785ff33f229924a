"""Privacy mechanisms that use the graph, on top of per-peer DP-SGD (``dp_mechanism``).

``local`` (default): DP-SGD alone, local accounting. ``muffliato``: the same noise; its per-pair
network figure through the exact view of `network_dp` is no guarantee for training (`muffliato`),
so its epsilon is DP-SGD's. ``zipdl``: zero-sum noise on the
messages per edge (`zipdl`). ``decor``: antisymmetric pairwise noise from Diffie-Hellman pair keys
on top of small independent noise (`decor`, `pair_secrets`). Config keys: ``dp_mechanism``,
``dp_zipdl_sigma`` (zipdl), ``dp_decor_sigma_cor`` (decor); ``dp_noise_multiplier`` is DP-SGD's
sigma, DECOR's sigma_ind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from gossip_powersgd.privacy.mechanisms.decor import PairwiseNoise
from gossip_powersgd.privacy.mechanisms.pair_secrets import agree_pair_keys
from gossip_powersgd.privacy.mechanisms.zipdl import ZeroSumNoise

if TYPE_CHECKING:
    from ...comm.base import Comm

__all__ = ["MECHANISMS", "SUPPORTED", "attach_mechanism", "validate_mechanism_config"]

MECHANISMS = ("local", "muffliato", "zipdl", "decor")
#: The algorithms each mechanism trains with. Muffliato's and DECOR's noise is on the local update,
#: so any gossip of the parameters carries it (the accounting differs, see their modules); ZIP-DL
#: needs the per-edge message hook (`GossipAlgorithm.supports_edge_noise`).
SUPPORTED = {
    "local": None,
    "muffliato": ("exact", "powergossip", "choco"),
    "zipdl": ("exact", "powergossip"),
    "decor": ("exact", "powergossip", "choco"),
}


def _algorithm_name(spec: str) -> str:
    return str(spec).split(":", 1)[0].strip()


def validate_mechanism_config(config) -> None:
    """One-line ValueError for a bad ``dp_mechanism`` setting of a `TrainConfig`."""
    mechanism = config.dp_mechanism
    if mechanism not in MECHANISMS:
        raise ValueError(f"dp_mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    dp_on = config.dp_noise_multiplier is not None or config.dp_target_epsilon is not None
    if mechanism != "zipdl" and config.dp_zipdl_sigma is not None:
        raise ValueError("dp_zipdl_sigma is for dp_mechanism: zipdl: set that, or drop the key")
    if mechanism != "decor" and config.dp_decor_sigma_cor is not None:
        raise ValueError("dp_decor_sigma_cor is for dp_mechanism: decor: set that, or drop the key")
    if mechanism == "local":
        return
    if not dp_on:
        raise ValueError(
            f"dp_mechanism: {mechanism} runs on DP-SGD: set dp_noise_multiplier (or "
            f"dp_target_epsilon) and dp_max_grad_norm"
        )
    algorithm = _algorithm_name(config.algorithm)
    if algorithm not in SUPPORTED[mechanism]:
        raise ValueError(
            f"dp_mechanism: {mechanism} works with algorithm "
            f"{' or '.join(SUPPORTED[mechanism])}, not {algorithm}"
        )
    if mechanism == "zipdl" and config.dp_zipdl_sigma is None:
        raise ValueError(
            "dp_mechanism: zipdl needs dp_zipdl_sigma (the std of its per-edge "
            "zero-sum noise on each message coordinate)"
        )
    if mechanism == "decor":
        if config.dp_noise_multiplier is not None and not config.dp_noise_multiplier > 0:
            raise ValueError(
                "dp_mechanism: decor needs dp_noise_multiplier > 0 (sigma_ind, the independent "
                "noise): without it a peer's pair noise is all a neighbour holding its keys must "
                "remove, and SecLDP gives no epsilon; set dp_noise_multiplier (e.g. 0.5)"
            )
        if config.dp_decor_sigma_cor is None:
            raise ValueError(
                "dp_mechanism: decor needs dp_decor_sigma_cor (the pairs' noise "
                "multiplier; dp_noise_multiplier is the independent one)"
            )
        if config.dp_target_epsilon is not None:
            raise ValueError(
                "dp_mechanism: decor takes dp_noise_multiplier (sigma_ind) and "
                "dp_decor_sigma_cor, not dp_target_epsilon (solve them for a target "
                "with privacy.mechanisms.decor.sigma_ind_for_target)"
            )


def attach_mechanism(
    config, comm: Comm, dp, algorithm, randomness, resume: bool = False
) -> Optional[object]:
    """Set the mechanism's noise up on this peer (collective for decor: the pair keys are agreed
    with every neighbour, and with `resume` the stored ones must all be there); returns what was
    attached, or None for local and muffliato."""
    mechanism = config.dp_mechanism
    if mechanism in ("zipdl", "decor") and not comm.is_static:
        raise ValueError(
            f"dp_mechanism: {mechanism} needs a static topology (its noise is per "
            f"edge of one graph), not the schedule {comm.topology.name!r}"
        )
    if mechanism == "zipdl":
        if not getattr(algorithm, "supports_edge_noise", False):
            raise ValueError(
                f"dp_mechanism: zipdl works with algorithm exact or powergossip, "
                f"not {algorithm.name}"
            )
        if len(comm.neighbors) < 2:
            raise ValueError(
                "dp_mechanism: zipdl needs every peer to have >= 2 neighbours (one "
                "message cannot carry zero-sum noise): use another topology"
            )
        algorithm.edge_noise = ZeroSumNoise(randomness, float(config.dp_zipdl_sigma))
        return algorithm.edge_noise
    if mechanism == "decor":
        kind = randomness.kind
        keys = agree_pair_keys(comm, kind, seed=config.seed, run_dir=config.out_dir, resume=resume)
        dp.extra_noise = PairwiseNoise(
            comm.rank, keys, float(config.dp_decor_sigma_cor), dp.max_grad_norm, kind
        )
        return dp.extra_noise
    return None
