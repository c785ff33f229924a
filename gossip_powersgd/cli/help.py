"""What `gossip-train --help-config` lists after the config keys: the accepted values of every
registered kind (algorithms, transports, datasets, models, privacy mechanisms), read from the
registries themselves (`gossip_powersgd.registries`), so that an entry registered before the call
is listed too."""

from __future__ import annotations

__all__ = ["describe_registries"]


def describe_registries() -> str:
    """Every registry's accepted values: usage, summary and options with their defaults."""
    from gossip_powersgd.algorithms import describe_algorithms
    from gossip_powersgd.comm import transports  # noqa: F401 (each module registers its entries)
    from gossip_powersgd.privacy import mechanisms  # noqa: F401
    from gossip_powersgd.registries import HELP_ORDER, REGISTRIES
    from gossip_powersgd.training import datasets, models  # noqa: F401

    lines = ["algorithm: one of", *("  " + line for line in describe_algorithms().splitlines())]
    ordered = sorted(
        REGISTRIES,
        key=lambda r: HELP_ORDER.index(r.key) if r.key in HELP_ORDER else len(HELP_ORDER),
    )
    return "\n\n".join(["\n".join(lines)] + [registry.describe() for registry in ordered])
