"""Tests for topologies.spec: `parse` of static spellings (round trips of every generator's name,
sizes passed as n, `file:` specs, and its one-line errors). The static spellings are cut and built by
`generators.split_topology_spec` and `generators.parse_static`, which are reached only through
`parse`; the schedules' spellings: test_schedules.py."""

from __future__ import annotations

import numpy as np
import pytest

import topologies
from tests.topologies._support import assert_valid_mixing


# --- parse ---------------------------------------------------------------------------------------


SPECS = [
    "ring:8",
    "ring:1",
    "ring:2",
    "torus:4x4",
    "torus:2x2x2",
    "torus:3x5",
    "grid:4x4",
    "grid:2x3x2",
    "complete:8",
    "star:8",
    "hypercube:3",
    "exponential:8",
    "random_regular:8:3",
    "random_regular:10:4:7",
    "small_world:16:4:0.2",
    "small_world:12:4:0.5:3",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("scheme", [None, "max_degree", "best_constant"])
def test_parse_round_trips(spec, scheme):
    t = topologies.parse(spec, weights=scheme)
    assert t.name == spec
    assert t.scheme == (scheme or "metropolis")
    again = topologies.parse(t.name, n=t.size, weights=scheme)
    assert again == t and again.fingerprint == t.fingerprint
    assert_valid_mixing(t)


def test_parse_matches_generators():
    assert topologies.parse("torus:4x4") == topologies.torus(4, 4)
    assert topologies.parse("ring", n=8) == topologies.ring(8)
    assert topologies.parse(" Ring:8 ") == topologies.ring(8)
    assert topologies.parse("random-regular:8:3") == topologies.random_regular(8, 3)
    assert topologies.parse("random_regular:3", n=8) == topologies.random_regular(8, 3)
    assert topologies.parse("small_world:4:0.2", n=16) == topologies.small_world(16, 4, 0.2)
    assert topologies.parse("hypercube", n=8) == topologies.hypercube(3)
    assert topologies.parse("torus", n=16).name == "torus:4x4"
    assert topologies.parse("grid", n=8).name == "grid:2x4"
    assert topologies.parse("ring:8", weights="uniform").scheme == "uniform"
    t = topologies.ring(4)
    assert topologies.parse(t, n=4) is t


def test_parse_file_spec(tmp_path):
    p = tmp_path / "edges.txt"
    p.write_text("0 1\n1 2\n2 0\n")
    t = topologies.parse(f"file:{p}")
    assert t.name == f"file:{p}" and t == topologies.parse(t.name)
    np.testing.assert_array_equal(t.W, topologies.ring(3).W)


@pytest.mark.parametrize(
    "spec,kwargs,match",
    [
        (
            "moebius:8",
            {},
            r"^topology spec 'moebius:8': unknown name 'moebius'; valid: ring, torus, grid",
        ),
        ("", {}, "topology spec '': unknown name ''"),
        ("ring", {}, "size is missing"),
        ("ring:eight", {}, "'eight' is not a valid integer"),
        ("ring:8:2", {}, "too many fields"),
        ("torus:4x", {}, "not a valid integer"),
        ("hypercube", {"n": 6}, "not a power of two"),
        ("small_world:16:4", {}, "size is missing"),
        ("random_regular:1:2:3:4", {}, "wrong number of fields"),
        ("ring:8", {"n": 4}, "has 8 nodes but n=4"),
        ("file:", {}, "missing path"),
    ],
)
def test_parse_errors(spec, kwargs, match):
    with pytest.raises(ValueError, match=match):
        topologies.parse(spec, **kwargs)
