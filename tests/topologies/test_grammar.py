"""Tests for topologies.grammar, the one spec grammar: top-level splitting, `parse_spec` on every
kind's spelling and its one-line errors, that `gossip_powersgd.specs` re-exports it rather than a
copy, and topology specs taking its square brackets. (`gossip_powersgd.specs`' own helpers built on
it: tests/test_specs.py.)"""

import numpy as np
import pytest

import topologies
from gossip_powersgd import specs
from gossip_powersgd.specs import split_spec, split_top_level


def test_split_top_level_keeps_bracketed_commas():
    assert split_top_level("a=1,b=[x,y],c=[[p,q],r]") == ["a=1", "b=[x,y]", "c=[[p,q],r]"]
    assert split_top_level("") == [""]


def test_one_grammar_for_every_spec():
    from gossip_powersgd.specs import Spec, parse_spec

    assert parse_spec("topk:0.01") == Spec("topk", ("0.01",), {})
    assert parse_spec("mlp:100,100") == Spec("mlp", ("100", "100"), {})
    assert parse_spec("Synthetic_Logreg:d=5, n=1000") == Spec(
        "synthetic_logreg", (), {"d": "5", "n": "1000"}
    )
    assert parse_spec("lowrank:2,iterations=3") == Spec("lowrank", ("2",), {"iterations": "3"})
    assert parse_spec("choco:compressor=[randomk:0.1,seed=3],gamma=0.4").options == {
        "compressor": "randomk:0.1,seed=3",
        "gamma": "0.4",
    }
    assert parse_spec("cyclic:[ring:8],[star:8]").positional == ("ring:8", "star:8")
    assert parse_spec("resnet20:width=16") == Spec("resnet20", (), {"width": "16"})
    # A name with a dot is a bring-your-own import: its attribute belongs to it, case kept.
    byo = parse_spec("my_pkg.Models:Wide:width=32,depth=[2]")
    assert byo == Spec("my_pkg.Models:Wide", (), {"width": "32", "depth": "2"}) and byo.is_import
    assert parse_spec("pkg.mod:fn").name == "pkg.mod:fn" and not parse_spec("ring:8").is_import
    assert split_spec("pkg.mod:fn:width=32", "model spec") == ("pkg.mod:fn", {"width": "32"})
    for spec, message in [
        ("x:a=1,a=2", "^thing 'x:a=1,a=2': option 'a' is given twice; give it once$"),
        ("x:a=[1", r"^thing 'x:a=\[1': unbalanced square brackets$"),
        (" ", "^thing must be a non-empty string, got ' '$"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_spec(spec, "thing")


def test_grammar_lives_below_both_packages():
    # One grammar, not a copy: gossip_powersgd.specs re-exports the one in topologies (the lowest
    # layer), and topologies' parser goes through it.
    import topologies.grammar as grammar

    assert specs.parse_spec is grammar.parse_spec and specs.Spec is grammar.Spec
    assert grammar.parse_spec("small_world:16:4:0.2", separator=":", imports=False) == (
        grammar.Spec("small_world", ("16", "4", "0.2"))
    )


@pytest.mark.parametrize(
    "bracketed, plain",
    [
        ("edge_sampling:[ring:16]:0.5:3", "edge_sampling:ring:16:0.5:3"),
        ("cyclic:[ring:8],[star:8]", "cyclic:ring:8,star:8"),
        ("Small_World:[16]:4:0.2", "small_world:16:4:0.2"),
    ],
)
def test_topology_specs_take_the_grammars_brackets(bracketed, plain):
    a, b = topologies.parse(bracketed), topologies.parse(plain)
    assert a.size == b.size
    graphs = [(a.at(t), b.at(t)) for t in range(4)] if hasattr(a, "at") else [(a, b)]
    for x, y in graphs:
        assert np.array_equal(x.W, y.W)


def test_check_options_refuses_an_option_the_kind_does_not_take_listing_those_it_does():
    from topologies.grammar import check_options, parse_spec

    spec = "thing:a=1,b=2"
    check_options(parse_spec(spec), ["a", "b", "c"], "thing", spec)  # every key known: no error
    with pytest.raises(ValueError, match=r"^thing 'thing:a=1,b=2': unknown option 'b'; valid: a$"):
        check_options(parse_spec(spec), ["a"], "thing", spec)
    with pytest.raises(ValueError, match=r"unknown option 'a'; valid: none$"):
        check_options(parse_spec(spec), [], "thing", spec)
