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

import importlib
from typing import TYPE_CHECKING, Optional

from gossip_powersgd.privacy.mechanisms.registry import (
    MECHANISMS as MECHANISM_REGISTRY,
    Mechanism,
    register_mechanism,
    supporting_algorithms,
)

if TYPE_CHECKING:
    from ...comm.base import Comm

__all__ = [
    "MECHANISMS",
    "SUPPORTED",
    "Mechanism",
    "MECHANISM_REGISTRY",
    "register_mechanism",
    "attach_mechanism",
    "validate_mechanism_config",
]

#: Each built-in mechanism's module registers it (`registry.MECHANISMS`, after ``local``), in this
#: order (the order errors and `--help-config` list them).
for _module in ("muffliato", "zipdl", "decor"):
    importlib.import_module(f"{__name__}.{_module}")

# The names this package exported before its registry (kept working).
from gossip_powersgd.privacy.mechanisms.decor import PairwiseNoise  # noqa: E402,F401
from gossip_powersgd.privacy.mechanisms.pair_secrets import agree_pair_keys  # noqa: E402,F401
from gossip_powersgd.privacy.mechanisms.zipdl import ZeroSumNoise  # noqa: E402,F401


def __getattr__(name: str):
    """`MECHANISMS`: the registered names; `SUPPORTED`: {mechanism: the algorithms that declare
    what it needs, or None for any}, both read from the registries when asked."""
    if name == "MECHANISMS":
        return MECHANISM_REGISTRY.names()
    if name == "SUPPORTED":
        return {
            m.name: supporting_algorithms(m.needs) if m.needs else None for m in MECHANISM_REGISTRY
        }
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _refuse_unsupported(mechanism: Mechanism, algorithm: type) -> None:
    """Ask the algorithm class whether it has what the mechanism needs (its capability)."""
    if mechanism.needs is not None and not getattr(algorithm, mechanism.needs, False):
        raise ValueError(
            f"dp_mechanism: {mechanism.name} works with algorithm "
            f"{' or '.join(supporting_algorithms(mechanism.needs))}, not {algorithm.name}"
        )


def validate_mechanism_config(config) -> None:
    """One-line ValueError for a bad ``dp_mechanism`` setting of a `TrainConfig`: the generic
    checks from what each mechanism declares, then the mechanism's own (`check_config`)."""
    name = config.dp_mechanism
    if name not in MECHANISM_REGISTRY:
        raise ValueError(
            f"dp_mechanism must be one of {', '.join(MECHANISM_REGISTRY.names())}, got {name!r}"
        )
    for other in MECHANISM_REGISTRY:
        for key in other.keys:
            if other.name != name and getattr(config, key, None) is not None:
                raise ValueError(
                    f"{key} is for dp_mechanism: {other.name}: set that, or drop the key"
                )
    mechanism = MECHANISM_REGISTRY.get(name)
    dp_on = config.dp_noise_multiplier is not None or config.dp_target_epsilon is not None
    if mechanism.needs_dp and not dp_on:
        raise ValueError(
            f"dp_mechanism: {name} runs on DP-SGD: set dp_noise_multiplier (or "
            f"dp_target_epsilon) and dp_max_grad_norm"
        )
    _refuse_unsupported(mechanism, config.algorithm_spec.cls)
    mechanism.check_config(config)


def mechanism_of(config) -> Mechanism:
    """The registered mechanism a config's ``dp_mechanism`` names."""
    return MECHANISM_REGISTRY.get(config.dp_mechanism)


def attach_mechanism(
    config, comm: Comm, dp, algorithm, randomness, resume: bool = False
) -> Optional[object]:
    """Set the mechanism's noise up on this peer (collective for decor: the pair keys are agreed
    with every neighbour, and with `resume` the stored ones must all be there); returns what was
    attached, or None for local and muffliato."""
    mechanism = mechanism_of(config)
    if mechanism.static_graph and not comm.is_static:
        raise ValueError(
            f"dp_mechanism: {mechanism.name} needs a static topology (its noise is per "
            f"edge of one graph), not the schedule {comm.topology.name!r}"
        )
    _refuse_unsupported(mechanism, type(algorithm))
    return mechanism.attach(config, comm, dp, algorithm, randomness, resume)
