"""experiments/pages/__init__.py, the page registry: every module or package here whose name does
not start with "_" is a page and registers itself once; a name registered by two modules is
refused in one line naming both."""

from __future__ import annotations

import dataclasses
import functools
import pkgutil

import pytest

import experiments.pages as registry


def test_every_page_module_registers_one_page_under_its_own_name():
    modules = {m.name for m in pkgutil.iter_modules(registry.__path__) if m.name[0] != "_"}
    found = registry.pages()
    # privacy_attacks registers its overfit variant too, privacy_mechanisms its logreg variant
    assert modules <= set(found)
    for name, page in found.items():
        assert page.name == name
        owner = registry.owner(page).split(".")[2]
        assert owner in modules and (owner == name or name.startswith(owner)), (name, owner)
    assert registry.pages() == found  # a second call imports nothing new and finds the same


def _elsewhere(rows):  # a render function of another module
    raise AssertionError("not called")


_elsewhere.__module__ = "somebody.else"


@pytest.mark.parametrize("name", ["gamma", "privacy_attacks"])  # a function; a functools.partial
def test_a_name_registered_by_a_second_module_is_refused(monkeypatch, name):
    """Refused whether the page's render is a function or a `functools.partial` of one (pages
    built from one module's functions for two settings): a partial's module is functools'."""
    monkeypatch.setattr(registry, "_PAGES", dict(registry.pages()))
    taken = registry.pages()[name]
    for twin in (
        dataclasses.replace(taken, render=_elsewhere),
        dataclasses.replace(taken, render=functools.partial(_elsewhere)),
    ):
        with pytest.raises(
            ValueError, match=rf"^page '{name}' is registered by experiments\.pages"
        ):
            registry.register(twin)
    assert registry.register(taken) is taken  # the same module again (a re-import) is no clash
