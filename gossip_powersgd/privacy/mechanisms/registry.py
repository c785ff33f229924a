"""The privacy mechanisms a config's ``dp_mechanism`` names: `MECHANISMS`, a `Registry` of
`Mechanism` classes.

A mechanism describes itself: its own config keys (`keys`, refused under any other mechanism),
whether it runs on DP-SGD, on one fixed graph, whether its per-pair network figure is reported,
and what it needs of the algorithm (`needs`: a capability the algorithm class declares, such as
``supports_edge_noise``); it never names algorithms. Its own config checks are `check_config`, and
`attach` sets its noise up on a peer. A new mechanism is one file with a `Mechanism` subclass plus
`register_mechanism(...)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from gossip_powersgd.registries import Registry

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

__all__ = ["Mechanism", "MECHANISMS", "register_mechanism", "supporting_algorithms"]

#: What each capability an algorithm may declare means, as errors and `--help-config` say it.
CAPABILITIES = {
    "supports_edge_noise": "a different noisy message per edge (`GossipAlgorithm.edge_noise`)",
    "supports_update_noise": "noise on the local update carried by a gossip of the models",
}


class Mechanism:
    """One mechanism. Subclasses declare `name` and `summary`, and override what they change."""

    name: Optional[str] = None
    summary: Optional[str] = None
    options: dict = {}
    #: Its own config keys: set under another mechanism, each is refused.
    keys: Tuple[str, ...] = ()
    #: Whether it runs on DP-SGD (dp_noise_multiplier or dp_target_epsilon must be set).
    needs_dp = True
    #: The algorithm capability it needs (a class attribute of `GossipAlgorithm`; None: any).
    needs: Optional[str] = None
    #: Whether its noise is bound to one fixed graph (a schedule is refused).
    static_graph = False
    #: Whether the summary reports its per-pair network figure (`accounting.NETWORK_NOTE`).
    network_bound = False

    def check_config(self, config) -> None:
        """Its own one-line ValueErrors for a config (after the generic checks)."""

    def epsilon_note(self, config) -> Tuple[Optional[str], Optional[str]]:
        """(what the run's epsilon means, a warning line), or (None, None)."""
        return None, None

    def attach(self, config, comm: "Comm", dp, algorithm, randomness, resume: bool):
        """Set the noise up on this peer (collective where it must agree with neighbours);
        returns what was attached, or None."""
        return None


def _declares_needs(cls) -> list:
    if cls.needs is not None and cls.needs not in CAPABILITIES:
        return [f"`needs` (None or one of {', '.join(CAPABILITIES)})"]
    return []


MECHANISMS = Registry("privacy mechanism", "dp_mechanism", Mechanism, check=_declares_needs)
register_mechanism = MECHANISMS.register


def supporting_algorithms(capability: Optional[str]) -> Tuple[str, ...]:
    """The registered algorithms declaring `capability` (all of them for None), in order."""
    from gossip_powersgd.algorithms import REGISTRY

    return tuple(
        name
        for name, cls in REGISTRY.items()
        if capability is None or getattr(cls, capability, False)
    )


@register_mechanism
class Local(Mechanism):
    name = "local"
    summary = "DP-SGD alone on each peer, its own local accounting (the default; DP may be off)"
    needs_dp = False
