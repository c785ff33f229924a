"""`privacy.mechanisms.registry`: the mechanisms describe themselves — each config key belongs to
one mechanism, each need is a capability algorithms declare, the algorithms a mechanism works with
are those that declare its need, and an entry needing an unknown capability is refused."""

from __future__ import annotations

import pytest

from gossip_powersgd.algorithms import REGISTRY
from gossip_powersgd.privacy.mechanisms import MECHANISM_REGISTRY
from gossip_powersgd.privacy.mechanisms.registry import (
    CAPABILITIES,
    MECHANISMS,
    Mechanism,
    supporting_algorithms,
)
from gossip_powersgd.training.config import valid_keys


def test_the_shipped_mechanisms_declare_valid_needs_and_keys_of_their_own():
    assert MECHANISMS is MECHANISM_REGISTRY
    assert {"local", "muffliato", "zipdl", "decor"} <= set(MECHANISMS.names())
    owner = {}
    for name in MECHANISMS.names():
        entry = MECHANISMS.get(name)
        assert entry.needs is None or entry.needs in CAPABILITIES, name
        for key in entry.keys:
            assert key in valid_keys(), (name, key)  # a key a config can hold
            assert owner.setdefault(key, name) == name, key  # refused under every other one
    local = MECHANISMS.get("local")
    assert not local.needs_dp and local.needs is None and local.keys == ()


def test_the_supporting_algorithms_are_those_declaring_the_capability():
    # What the one-line refusals name (tests/privacy/mechanisms/test_mechanisms.py).
    assert supporting_algorithms("supports_edge_noise") == ("exact", "powergossip")
    assert supporting_algorithms("supports_update_noise") == ("exact", "powergossip", "choco")
    assert supporting_algorithms(None) == tuple(REGISTRY)  # no need: every algorithm


def test_an_entry_needing_an_unknown_capability_is_refused_naming_the_known_ones():
    class Wishful(Mechanism):
        name = "wishful"
        summary = "needs a capability no algorithm can declare"
        needs = "supports_telepathy"

    with pytest.raises(TypeError, match=r"`needs` \(None or one of supports_edge_noise, "):
        MECHANISMS.register(Wishful)
    assert "wishful" not in MECHANISMS.names()
