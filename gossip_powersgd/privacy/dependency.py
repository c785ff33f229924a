"""Opacus, imported on first use so that the rest of the package works without it installed."""

from __future__ import annotations

import importlib
from types import ModuleType

#: What a user without Opacus reads when they turn differential privacy on.
MISSING_OPACUS = "differential privacy needs Opacus: pip install 'gossip_powersgd[privacy]'"


def import_opacus(module: str = "opacus") -> ModuleType:
    """Import ``module`` (``"opacus"`` or one of its submodules); one-line ImportError if missing.

    Only an absent Opacus is turned into the install hint: an Opacus that is present but fails to
    import for another reason keeps its own error, which is what would help fixing it.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "opacus":
            raise ImportError(MISSING_OPACUS) from None
        raise
