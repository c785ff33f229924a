"""Opacus and dp-accounting, imported on first use so that the rest of the package works without
them installed."""

from __future__ import annotations

import importlib
from types import ModuleType

#: What a user without Opacus reads when they turn differential privacy on.
MISSING_OPACUS = "differential privacy needs Opacus: pip install 'gossip_powersgd[privacy]'"


def import_opacus(module: str = "opacus") -> ModuleType:
    """Import ``module`` (``"opacus"``, ``"dp_accounting"`` or a submodule); one-line ImportError
    if missing.

    Only an absent Opacus is turned into the install hint: an Opacus that is present but fails to
    import for another reason keeps its own error, which is what would help fixing it.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = None if exc.name is None else exc.name.split(".")[0]
        if top == "opacus":
            raise ImportError(MISSING_OPACUS) from None
        if top == "dp_accounting":
            raise ImportError(MISSING_OPACUS.replace("Opacus", "dp-accounting")) from None
        raise
