"""Tests for time-varying topologies (topologies.schedules) and directed graphs (topologies.directed)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import topologies
from topologies import DirectedSchedule, DirectedTopology, Schedule, Topology

REPO = Path(__file__).resolve().parents[2]


def assert_valid_step(t: Topology) -> None:
    """Every step's W: symmetric, doubly stochastic, non-negative off the diagonal."""
    W = t.W
    np.testing.assert_array_equal(W, W.T)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
    assert (W - np.diag(np.diag(W))).min() >= 0


def product(schedule, steps: int) -> np.ndarray:
    out = np.eye(schedule.size)
    for t in range(steps):
        step = schedule.at(t)
        out = (step.P if schedule.is_directed else step.W) @ out
    return out


# --- one-peer exponential ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_one_peer_exponential_averages_exactly_in_log2_n_steps(n):
    s = topologies.one_peer_exponential(n)
    log2n = n.bit_length() - 1
    assert s.period == log2n
    np.testing.assert_allclose(product(s, log2n), np.full((n, n), 1.0 / n), atol=1e-15)
    assert topologies.product_gap(s) == pytest.approx(1.0, abs=1e-12)
    for t in range(2 * log2n):
        step = s.at(t)
        assert_valid_step(step)
        for i in range(n):
            partner = i ^ (1 << (t % log2n))
            assert step.neighbors(i) == (partner,)
            assert step.weight(i, partner) == 0.5 and step.weight(i, i) == 0.5


def test_one_peer_exponential_union_is_the_hypercube():
    s = topologies.parse("one_peer_exponential:16")
    assert s == topologies.one_peer_exponential(16) and s.name == "one_peer_exponential:16"
    assert sorted(s.union.edges()) == sorted(topologies.hypercube(4).edges())
    np.testing.assert_array_equal(s.union.W, topologies.hypercube(4).W)  # metropolis, like union
    assert s.neighbors_union(0) == (1, 2, 4, 8)
    assert topologies.parse("one_peer_exponential", n=8).name == "one_peer_exponential:8"
    assert s.at(5) is s.at(1)  # periodic: the same cached step


# --- random perfect matchings --------------------------------------------------------------------


def test_matching_step_averages_each_pair():
    s = topologies.matchings(16)
    x = np.arange(16.0) ** 2
    for t in range(5):
        step = s.at(t)
        assert_valid_step(step)
        assert step.degrees == (1,) * 16
        mixed = step.W @ x
        for i, j in step.edges():
            assert mixed[i] == mixed[j] == (x[i] + x[j]) / 2


def test_matchings_are_pure_functions_of_seed_and_step():
    forward = topologies.matchings(16, seed=3)
    backward = topologies.parse("matchings:16:3")
    steps = range(3 * 8 + 5)  # more than the cache holds
    edges_forward = [forward.at(t).edges() for t in steps]
    edges_backward = [backward.at(t).edges() for t in reversed(steps)][::-1]
    assert edges_forward == edges_backward
    assert len({tuple(e) for e in edges_forward}) > 1  # the graph does change
    other = topologies.matchings(16, seed=4)
    assert [other.at(t).edges() for t in steps] != edges_forward
    assert forward.fingerprint == backward.fingerprint != other.fingerprint
    clone = pickle.loads(pickle.dumps(forward))
    assert clone == forward and clone.at(7).edges() == forward.at(7).edges()


def test_matchings_union_is_every_pair_and_names_round_trip():
    s = topologies.parse("matchings:8")
    assert s.period is None and not s.is_directed
    assert s.union.edges() == topologies.complete(8).edges()
    assert s.name == "matchings:8" and topologies.parse("matchings:8:5").name == "matchings:8:5"
    assert topologies.parse("matchings", n=6) == topologies.matchings(6)


# --- edge sampling -------------------------------------------------------------------------------


def test_edge_sampling_uses_metropolis_weights_on_the_active_edges():
    base = topologies.torus(4, 4)
    s = topologies.parse("edge_sampling:torus:4x4:0.5")
    assert s == topologies.edge_sampling(base, 0.5) and s.base == base and s.p == 0.5
    active = 0
    for t in range(40):
        step = s.at(t)
        assert_valid_step(step)
        assert set(step.edges()) <= set(base.edges())
        active += len(step.edges())
        deg = np.array(step.degrees)
        for i, j in step.edges():
            assert step.weight(i, j) == 1.0 / (1 + max(deg[i], deg[j]))
    assert active / (40 * len(base.edges())) == pytest.approx(0.5, abs=0.08)
    assert s.union.edges() == base.edges()


def test_edge_sampling_with_p_one_is_the_base_graph_every_step():
    s = topologies.parse("edge_sampling:ring:8:1")
    assert s.name == "edge_sampling:ring:8:1.0"
    for t in range(4):
        np.testing.assert_array_equal(s.at(t).W, topologies.ring(8).W)


def test_edge_sampling_spec_fields():
    assert topologies.parse("edge_sampling:ring:16:0.5:3").name == "edge_sampling:ring:16:0.5:3"
    # A base with colons of its own: the last field is p unless it is a seed after a p.
    assert topologies.parse(
        "edge_sampling:random_regular:8:3:0.5"
    ).base == topologies.random_regular(8, 3)
    s = topologies.parse("edge_sampling:small_world:12:4:0.5:3:0.25:7")
    assert s.base == topologies.small_world(12, 4, 0.5, 3) and s.p == 0.25
    assert topologies.parse(s.name) == s
    assert topologies.parse("edge_sampling:ring:0.5", n=8).base == topologies.ring(8)
    a, b = (
        topologies.parse("edge_sampling:ring:16:0.5"),
        topologies.parse("edge_sampling:ring:16:0.5:1"),
    )
    assert a.fingerprint != b.fingerprint
    assert [a.at(t).edges() for t in range(4)] != [b.at(t).edges() for t in range(4)]


# --- cyclic lists and static topologies ----------------------------------------------------------


def test_cyclic_list_uses_its_members_in_turn():
    s = topologies.parse("cyclic:ring:8,star:8,complete:8")
    assert s.period == 3 and s.name == "cyclic:ring:8,star:8,complete:8"
    assert [s.at(t) for t in range(6)] == [
        topologies.ring(8),
        topologies.star(8),
        topologies.complete(8),
    ] * 2
    assert topologies.cyclic(["ring:8", topologies.star(8), "complete:8"]) == s
    assert sorted(s.union.edges()) == topologies.complete(8).edges()
    assert topologies.parse("cyclic:ring,star", n=6).size == 6
    assert topologies.parse("cyclic:ring:8", weights="uniform").at(0).scheme == "uniform"


def test_cyclic_list_of_disconnected_graphs_with_a_connected_union(tmp_path):
    even, odd = tmp_path / "even.txt", tmp_path / "odd.txt"
    even.write_text("0 1\n2 3\n")
    odd.write_text("1 2\n3 0\n")
    s = topologies.parse(f"cyclic:file:{even},file:{odd}")
    assert s.at(0).edges() == [(0, 1), (2, 3)] and s.at(1).edges() == [(0, 3), (1, 2)]
    assert s.union.edges() == topologies.ring(4).edges()
    assert topologies.product_gap(s) == pytest.approx(1.0)  # 2x2 torus: two matchings average
    with pytest.raises(ValueError, match="not connected"):
        topologies.parse(f"file:{even}")  # a static topology must still be connected


def test_static_topology_is_its_own_constant_schedule():
    ring = topologies.ring(8)
    assert ring.at(0) is ring and ring.at(10**9) is ring
    assert ring.period == 1 and ring.union is ring and not ring.is_directed
    assert ring.neighbors_union(3) == ring.neighbors(3)
    assert topologies.product_gap(ring) == pytest.approx(ring.spectral_gap, abs=1e-12)
    fingerprints = {topologies.parse(s).fingerprint for s in ("cyclic:ring:8", "ring:8")}
    assert len(fingerprints) == 2  # a schedule never shares a fingerprint with a static topology


def test_steps_may_be_disconnected_but_are_otherwise_validated():
    W = np.array([[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    step = Topology(W, require_connected=False)
    assert step.neighbors(2) == ()
    assert pickle.loads(pickle.dumps(step)) == step
    with pytest.raises(ValueError, match="not connected"):
        Topology(W)
    with pytest.raises(ValueError, match="not symmetric"):
        Topology(np.array([[0.5, 0.5], [0.25, 0.75]]), require_connected=False)
    with pytest.raises(ValueError, match="doubly stochastic"):
        Topology(np.array([[0.5, 0.0], [0.0, 1.0]]), require_connected=False)


# --- bad schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,kwargs,match",
    [
        ("one_peer_exponential:12", {}, "power of two >= 2, got n=12"),
        ("one_peer_exponential:1", {}, "must be >= 2"),
        ("directed_exponential:1", {}, "must be >= 2"),
        ("matchings:7", {}, "even number of peers"),
        ("edge_sampling:ring:8:0", {}, r"p must be in \(0, 1\], got 0.0"),
        ("edge_sampling:ring:8:1.5", {}, r"p must be in \(0, 1\], got 1.5"),
        ("edge_sampling:ring:8:-0.5", {}, r"p must be in \(0, 1\]"),
        ("edge_sampling:ring:8:nan", {}, r"p must be in \(0, 1\]"),
        ("edge_sampling:ring:8:half", {}, "'half' is not a valid number"),
        (
            "edge_sampling:ring:16:1e-6",
            {},
            r"first 1024 steps \(64 per peer\) has \d+ components.*; raise p",
        ),
        ("edge_sampling:matchings:8:0.5", {}, "sample the edges of a static topology"),
        ("edge_sampling:0.5", {}, "give a base topology and a probability"),
        ("cyclic:ring:8,ring:6", {}, r"same size, got sizes \[6, 8\]"),
        ("cyclic:ring:8,matchings:8", {}, "is a schedule; list static topologies only"),
        ("cyclic:", {}, "no topologies listed"),
        ("one_peer_exponential", {}, "size is missing"),
        ("one_peer_exponential:8:2", {}, "too many fields"),
        ("matchings:8", {"weights": "uniform"}, "weights are fixed"),
        ("one_peer_exponential:16", {"n": 8}, "has 16 nodes but n=8"),
        ("matchings:eight", {}, "'eight' is not a valid integer"),
    ],
)
def test_bad_schedules_are_one_line_errors(spec, kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        topologies.parse(spec, **kwargs)
    assert "\n" not in str(info.value)


def test_disconnected_union_of_a_period_is_rejected(tmp_path):
    pair = tmp_path / "pair.txt"
    pair.write_text("0 1\n2 3\n")
    with pytest.raises(ValueError, match=r"over one period \(2 steps\) has 2 components"):
        topologies.parse(f"cyclic:file:{pair},file:{pair}")


def test_bad_steps_are_refused():
    s = topologies.matchings(4)
    for t, match in (
        (-1, "must be >= 0"),
        (1.5, "must be an integer"),
        (True, "must be an integer"),
    ):
        with pytest.raises(ValueError, match=match):
            s.at(t)
    with pytest.raises(ValueError, match="must be >= 0"):
        topologies.ring(4).at(-1)
    with pytest.raises(ValueError, match="no period"):
        topologies.product_gap(s)


@pytest.mark.parametrize(
    "spec",
    [
        "one_peer_exponential:8192",
        "matchings:5000",
        "directed_exponential:5000",
        "edge_sampling:ring:5000:0.5",
    ],
)
def test_oversized_schedules_are_refused_before_allocation(spec):
    with pytest.raises(ValueError, match=f"above the maximum of {topologies.MAX_PEERS}"):
        topologies.parse(spec)


# --- directed graphs -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 8, 16])
def test_directed_exponential_averages_exactly_in_log2_n_steps(n):
    s = topologies.parse(f"directed_exponential:{n}")
    assert isinstance(s, DirectedSchedule) and s.is_directed and not isinstance(s, Schedule)
    log2n = n.bit_length() - 1
    assert s.period == log2n
    np.testing.assert_allclose(product(s, log2n), np.full((n, n), 1.0 / n), atol=1e-15)
    assert topologies.product_gap(s) == pytest.approx(1.0, abs=1e-12)
    for t in range(log2n):
        step = s.at(t)
        np.testing.assert_allclose(step.P.sum(axis=0), 1.0)
        for i in range(n):
            assert step.out_neighbors(i) == (((i + (1 << t)) % n),)
            assert step.in_neighbors(i) == (((i - (1 << t)) % n),)


def test_directed_exponential_on_any_size_is_strongly_connected_column_stochastic():
    s = topologies.directed_exponential(6)
    assert s.period == 3 and s.union.out_degrees == (3,) * 6
    for t in range(3):
        np.testing.assert_allclose(s.at(t).P.sum(axis=0), 1.0)
    assert 0 < topologies.product_gap(s) < 1


def test_directed_edge_list_has_uniform_push_weights(tmp_path):
    path = tmp_path / "cycle.txt"
    path.write_text("# i sends to j\n0 1\n0 2\n1 2\n2 0\n")
    d = topologies.from_directed_edge_list(path)
    assert d == topologies.parse(f"directed_file:{path}") and d.is_directed
    assert not isinstance(d, Topology) and d.at(3) is d and d.union is d and d.period == 1
    assert d.out_neighbors(0) == (1, 2) and d.in_neighbors(2) == (0, 1)
    assert d.edges() == [(0, 1), (0, 2), (1, 2), (2, 0)]
    expected = np.array([[1 / 3, 0, 1 / 2], [1 / 3, 1 / 2, 0], [1 / 3, 1 / 2, 1 / 2]])
    np.testing.assert_allclose(d.P, expected)
    assert pickle.loads(pickle.dumps(d)) == d


def test_bad_directed_graphs_are_one_line_errors(tmp_path):
    one_way = tmp_path / "one_way.txt"
    one_way.write_text("0 1\n1 2\n")
    with pytest.raises(ValueError, match="not strongly connected: 3 strong components"):
        topologies.from_directed_edge_list(one_way)
    garbled = tmp_path / "garbled.txt"
    garbled.write_text("0 1\n1 x\n")
    with pytest.raises(ValueError, match=r"garbled.txt:2: cannot parse '1 x'"):
        topologies.from_directed_edge_list(garbled)
    with pytest.raises(ValueError, match="not column-stochastic: column 1"):
        DirectedTopology(np.array([[0.5, 0.5], [0.5, 0.6]]))
    with pytest.raises(ValueError, match="negative weight"):
        DirectedTopology(np.array([[1.5, 0.5], [-0.5, 0.5]]))
    with pytest.raises(ValueError, match="weights are fixed"):
        topologies.parse(f"directed_file:{one_way}", weights="uniform")


def test_directed_and_undirected_fingerprints_differ():
    ring = topologies.ring(2)  # W = [[.5, .5], [.5, .5]] is column-stochastic too
    as_directed = DirectedTopology(ring.W)
    np.testing.assert_array_equal(as_directed.P, ring.W)
    assert as_directed.fingerprint != ring.fingerprint
    assert as_directed != ring and as_directed.is_directed and not ring.is_directed


# --- CLI -----------------------------------------------------------------------------------------


def _show(*args):
    return subprocess.run(
        [sys.executable, "-m", "topologies", "show", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, MPLBACKEND="Agg"),
        timeout=120,
    )


def test_cli_show_describes_a_schedule():
    r = _show("one_peer_exponential:16")
    assert r.returncode == 0, r.stderr
    assert "period                    4\n" in r.stdout
    assert "union edges               32" in r.stdout and "union degrees             4" in r.stdout
    assert all(f"step {t}                    8 edges, degrees 1" in r.stdout for t in range(4))
    assert "product gap (one period)  1.0" in r.stdout
    assert topologies.one_peer_exponential(16).fingerprint in r.stdout


def test_cli_show_random_and_directed_schedules(capsys, tmp_path):
    from topologies.__main__ import main

    assert main(["show", "matchings:8", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "none (random)" in out and "step 2 " in out and "step 3 " not in out
    assert "product gap (steps 0..2)" in out
    assert main(["show", "directed_exponential:8"]) == 0
    out = capsys.readouterr().out
    assert "directed" in out and "yes" in out and "product gap (one period)  1.0" in out
    png = tmp_path / "union.png"
    assert main(["show", "one_peer_exponential:8", "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["show", "directed_exponential:8", "--png", str(png)]) == 2
    assert "undirected graphs only" in capsys.readouterr().err


def test_cli_bad_schedule_is_one_line_exit_2():
    r = _show("one_peer_exponential:12")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "power of two" in r.stderr
