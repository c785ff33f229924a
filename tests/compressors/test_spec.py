"""Tests for gossip_powersgd.compressors.spec: bad constructor arguments are named, and the CLI
spelling round-trips through repr()."""

import pytest

from gossip_powersgd.compressors import QSGD, LowRank, RandomK, SignNorm, TopK, parse_compressor


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: TopK(0), "ratio"),
        (lambda: TopK(1.5), "ratio"),
        (lambda: TopK(-0.1), "ratio"),
        (lambda: TopK(float("nan")), "ratio"),
        (lambda: RandomK(0), "ratio"),
        (lambda: RandomK(2), "ratio"),
        (lambda: RandomK(0.1, seed=1.5), "seed"),
        (lambda: QSGD(0), "levels"),
        (lambda: QSGD(-3), "levels"),
        (lambda: QSGD(2.5), "levels"),
        (lambda: LowRank(0), "rank"),
        (lambda: LowRank(1, iterations=0), "iterations"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_valid_range_is_in_the_message():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        TopK(0)
    with pytest.raises(ValueError, match=">= 1"):
        LowRank(0)


@pytest.mark.parametrize(
    "spec",
    [
        "identity",
        "topk:0.01",
        "topk:1.0",
        "randomk:0.01",
        "randomk:0.5,seed=3,scaled=true",
        "sign",
        "qsgd:16",
        "lowrank:1",
        "lowrank:4,iterations=2",
    ],
)
def test_parse_round_trips(spec):
    c = parse_compressor(spec)
    assert repr(c) == spec
    assert parse_compressor(repr(c)) == c


def test_parse_builds_the_right_objects():
    assert parse_compressor("topk:0.01") == TopK(0.01)
    assert parse_compressor(" QSGD : 16 ") == QSGD(16)
    assert parse_compressor("randomk:ratio=0.2,scaled=1") == RandomK(0.2, scaled=True)
    assert parse_compressor("lowrank:rank=2,iterations=3") == LowRank(2, iterations=3)
    assert repr(RandomK(0.2, seed=5)) == "randomk:0.2,seed=5"
    assert isinstance(parse_compressor("sign"), SignNorm)
    c = TopK(0.1)
    assert parse_compressor(c) is c


@pytest.mark.parametrize(
    "spec, message",
    [
        ("foo", "unknown name 'foo'; valid: identity, topk, randomk, sign, qsgd, lowrank"),
        ("topk", "needs ratio"),
        ("topk:abc", "ratio"),
        ("topk:2", "ratio"),
        ("qsgd:1.5", "levels"),
        ("lowrank:1,bogus=2", "bogus"),
        ("identity:3", "cannot parse"),
        ("lowrank:1,2", "cannot parse"),
        ("randomk:0.1,scaled=maybe", "scaled"),
        ("lowrank:1,rank=2", "twice"),
    ],
)
def test_parse_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_compressor(spec)
