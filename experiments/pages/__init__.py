"""The results pages of `python -m experiments`, and their registry.

Every module (or package) here whose name does not start with "_" is a page: importing it calls
`register(Page(...))` once. A new page is one new module here; nothing else lists it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Dict

from experiments.engine import Page

_PAGES: Dict[str, Page] = {}


def owner(page: Page) -> str:
    """The module that registered `page`: its render function's (through `functools.partial`)."""
    render = page.render
    while isinstance(render, functools.partial):
        render = render.func
    return render.__module__


def register(page: Page) -> Page:
    """Add `page` to the registry (a name registered twice by two modules is refused)."""
    known = _PAGES.get(page.name)
    if known is not None and owner(known) != owner(page):
        raise ValueError(
            f"page {page.name!r} is registered by {owner(known)} and {owner(page)}: give one of "
            "them another name"
        )
    _PAGES[page.name] = page
    return page


def pages() -> Dict[str, Page]:
    """{name: Page} of every page module in this folder (imported on first call)."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(_PAGES)
