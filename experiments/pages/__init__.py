"""The results pages of `python -m experiments`, and their registry.

Every module (or package) here whose name does not start with "_" is a page: importing it calls
`register(Page(...))` once. A new page is one new module here; nothing else lists it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Dict

from experiments.engine import Page

_PAGES: Dict[str, Page] = {}


def register(page: Page) -> Page:
    """Add `page` to the registry (a name registered twice by two modules is refused)."""
    known = _PAGES.get(page.name)
    if known is not None and known.render.__module__ != page.render.__module__:
        raise ValueError(
            f"page {page.name!r} is registered by {known.render.__module__} and "
            f"{page.render.__module__}: give one of them another name"
        )
    _PAGES[page.name] = page
    return page


def pages() -> Dict[str, Page]:
    """{name: Page} of every page module in this folder (imported on first call)."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(_PAGES)
