"""cli/help.py: what `--help-config` lists after the keys: every registry's accepted values, read
from the registries themselves (the program's output: tests/test_registries.py)."""

from gossip_powersgd.algorithms.registry import REGISTRY
from gossip_powersgd.cli.help import describe_registries
from gossip_powersgd.registries import REGISTRIES


def test_every_registered_entry_is_listed():
    text = describe_registries()
    for name in REGISTRY:
        assert f"\n  {name}" in text, name
    for registry in REGISTRIES:
        assert registry.describe() in text


def test_describe_registries_names_the_kinds_in_order():
    text = describe_registries()
    keys = ("algorithm", "backend", "dataset", "model", "dp_mechanism")
    order = [text.index(f"\n{key}: one of") if key != "algorithm" else 0 for key in keys]
    assert order == sorted(order)
