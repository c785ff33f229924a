"""The exact network-DP accountant of noisy linear gossip (gossip_powersgd/privacy/network_dp.py):
hand values, the local-DP ceiling, reachability, exact rational arithmetic, and what it accepts (the
worst-shift SDP and the Gaussian-mechanism conversion: tests/privacy/test_gaussian.py)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings, strategies as st

import topologies
from gossip_powersgd.privacy.network_dp import (
    dp_epsilon,
    gaussian_epsilon,
    local_epsilon,
    pairwise_epsilon,
    pairwise_leakage,
    pairwise_privacy_loss,
    pairwise_rdp,
    per_message_composition_rdp,
    view_matrix,
)

SIGMA, DELTA = 5.0, 1e-5
#: Leakage is a squared norm of a projection computed by an SVD of a matrix with O(10..300) unit
#: rows: its rounding error is a few hundred eps (~1e-13); 1e-11 leaves a margin of 100.
LEAK_TOL = 1e-11


def test_ring4_example_the_observer_reads_off_the_opposite_peer():
    """Issue 23's example: ring:4 (Metropolis 1/3), observer 0, opposite peer 2, T = 2, sigma = 5.
    Observer 0 receives y1, y3, then y1(1) = (y0 + y1 + y2)/3: 3 y1(1) - y0 - y1 = y2 exactly."""
    ring = topologies.ring(4)
    a, peers = view_matrix(ring, 2, 0)
    assert a.shape == (4, 3) and list(peers) == [1, 2, 3]
    solution = np.linalg.lstsq(a.T, np.eye(3)[list(peers).index(2)], rcond=None)
    assert np.allclose(a.T @ solution[0], [0, 1, 0], atol=1e-14)  # e_2 is in the row space
    classic = pairwise_epsilon(ring, 2, SIGMA, DELTA, conversion="rdp")
    assert classic[2, 0] == pytest.approx(0.980, abs=5e-4)  # the classic RDP conversion: 0.9797
    assert classic[2, 0] == pytest.approx(
        local_epsilon(2, SIGMA, DELTA, conversion="rdp"), rel=LEAK_TOL
    )
    exact = pairwise_epsilon(ring, 2, SIGMA, DELTA)  # the analytic Gaussian conversion
    assert exact[2, 0] == pytest.approx(local_epsilon(2, SIGMA, DELTA), rel=LEAK_TOL)
    assert exact[2, 0] == pytest.approx(0.7255, abs=5e-5)
    # Muffliato's per-message sum gives 0.797: below what the observer provably learns.
    composed = dp_epsilon(per_message_composition_rdp(ring, 2, SIGMA), DELTA)[2, 0]
    assert composed == pytest.approx(0.797, abs=5e-4) and composed < classic[2, 0]


def test_a_view_that_determines_x_plus_eta_gives_exactly_local_dp():
    # complete:16 at T = 1: the observer receives every other peer's x + eta.
    for spec, steps in (("complete:16", 1), ("ring:16", 20), ("exponential:16", 20)):
        leak = pairwise_leakage(spec, steps)
        off = leak[~np.eye(16, dtype=bool)]
        assert np.allclose(off, 1.0, rtol=0, atol=LEAK_TOL), spec
        a, _ = view_matrix(spec, steps, 0)
        assert np.linalg.matrix_rank(a) == 15  # the view has full rank: it determines x + eta
        eps = pairwise_epsilon(spec, steps, SIGMA, DELTA)
        assert np.allclose(
            eps[~np.eye(16, dtype=bool)], local_epsilon(steps, SIGMA, DELTA), rtol=LEAK_TOL, atol=0
        )


def test_a_star_leaf_learns_only_the_sum_of_the_other_leaves():
    """star with 3 leaves, observer leaf 1, T = 2: it receives y_c, then y_c(1), a weighted
    average of all: with y_c and its own value known it learns y_2 + y_3, so ||P e_2||^2 = 1/2."""
    star = topologies.star(4)
    leak = pairwise_leakage(star, 2)
    assert leak[2, 1] == pytest.approx(0.5, abs=LEAK_TOL) and leak[0, 1] == pytest.approx(1.0)
    rho = pairwise_rdp(star, 2, SIGMA, sensitivity=3.0)
    assert rho[2, 1] == pytest.approx(9 * 0.5 / (2 * SIGMA**2))
    assert pairwise_privacy_loss is pairwise_rdp


def test_every_step_on_ring4_matches_the_hand_value():
    """ring:4, noise every step, T = 2, observer 0, peer 2: the view's rows are e1, e3 (block 0),
    (e1 + e2)/3 + e1' and (e2 + e3)/3 + e3' (block 1 primed; own columns dropped), and peer 2's
    step-1 noise does not reach 0. Projecting e2 on the row space gives 2 (1/3)(3/11) = 2/11."""
    for shift in ("any", "constant"):
        leak = pairwise_leakage("ring:4", 2, noise="every_step", shift=shift)
        assert leak[2, 0] == pytest.approx(2 / 11, abs=LEAK_TOL)
    # A neighbour's fresh value at every step reaches the observer directly: the T-fold ceiling.
    assert pairwise_leakage("complete:4", 3, noise="every_step")[1, 0] == pytest.approx(3.0)
    assert local_epsilon(3, SIGMA, DELTA, noise="every_step") == pytest.approx(
        float(gaussian_epsilon(math.sqrt(3) / SIGMA, DELTA))
    )


def test_a_peer_whose_noise_cannot_reach_the_observer_has_epsilon_zero():
    ring = topologies.ring(16)
    for noise in ("once", "every_step"):
        eps = pairwise_epsilon(ring, 3, SIGMA, DELTA, noise=noise)
        # Messages of steps t < 3 carry values from peers at distance <= 3 of the observer 0.
        assert all(eps[u, 0] == 0.0 for u in range(4, 13)), noise
        assert all(eps[u, 0] > 0.0 for u in (1, 2, 3, 13, 14, 15)), noise
    assert np.isnan(np.diag(eps)).all()


def test_schedules_and_spec_strings_are_accepted_and_other_inputs_refused():
    # Spec strings: the same as the parsed topology (this raised AttributeError 'W' before).
    assert np.array_equal(
        pairwise_epsilon("ring:8", 3, SIGMA, DELTA),
        pairwise_epsilon(topologies.parse("ring:8"), 3, SIGMA, DELTA),
        equal_nan=True,
    )
    # one_peer_exponential:8 at step 0 pairs i with i XOR 1, at step 1 with i XOR 2 (weights 1/2):
    # observer 0 receives y1, then (y2 + y3)/2 - half of each of 2 and 3.
    leak = pairwise_leakage("one_peer_exponential:8", 2)
    assert leak[1, 0] == pytest.approx(1.0) and leak[2, 0] == pytest.approx(0.5)
    assert leak[3, 0] == pytest.approx(0.5) and leak[4, 0] == 0.0
    schedule = topologies.parse("one_peer_exponential:8")
    assert np.array_equal(pairwise_leakage(schedule, 2), leak, equal_nan=True)
    # A step where the observer has no neighbour adds no row; with none at all its view is empty.
    sampled = topologies.parse("edge_sampling:ring:8:0.3")
    alone = [v for v in range(8) if not sampled.at(0).neighbors(v)]
    leak = pairwise_leakage(sampled, 1)
    assert alone and all((np.nan_to_num(leak[:, v]) == 0).all() for v in alone)
    assert all(
        leak[w, v] == pytest.approx(1.0) for v in range(8) for w in sampled.at(0).neighbors(v)
    )
    with pytest.raises(ValueError, match="directed.*not push-sum"):
        pairwise_epsilon("directed_exponential:8", 2, SIGMA, DELTA)
    with pytest.raises(TypeError, match="topology must be a topologies.Topology.*got ndarray"):
        pairwise_epsilon(np.eye(3), 2, SIGMA, DELTA)
    with pytest.raises(ValueError, match="noise must be one of 'once', 'every_step'"):
        pairwise_epsilon("ring:4", 2, SIGMA, DELTA, noise="twice")
    with pytest.raises(ValueError, match="sigma must be a finite number > 0"):
        pairwise_rdp("ring:4", 2, 0.0)
    with pytest.raises(ValueError, match="delta must lie strictly between 0 and 1"):
        pairwise_epsilon("ring:4", 2, SIGMA, 1.0)


def _exact_metropolis(topology) -> sympy.Matrix:
    """W in rationals from the Metropolis rule 1/(1 + max(deg_i, deg_j)), checked against t.W."""
    n, deg = topology.size, topology.degrees
    w = sympy.zeros(n, n)
    for i, j in topology.edges():
        w[i, j] = w[j, i] = sympy.Rational(1, 1 + max(deg[i], deg[j]))
    for i in range(n):
        w[i, i] = 1 - sum(w[i, j] for j in range(n) if j != i)
    assert np.allclose(np.array(w.tolist(), dtype=float), topology.W, rtol=0, atol=1e-15)
    return w


def _exact_leakage(topology, steps, observer, u, every_step):
    """a_u^T (A A^T)^+ a_u in exact rationals (constant shift with noise every step), with the view
    written out independently of `view_matrix`: block s of neighbour w's row at step t is
    row w of W^(t - s)."""
    w, n = _exact_metropolis(topology), topology.size
    blocks = steps if every_step else 1
    rows = [
        [(w ** (t - s))[nb, c] if s <= t else 0 for s in range(blocks) for c in range(n)]
        for t in range(steps)
        for nb in topology.neighbors(observer)
    ]
    keep = [k for k in range(blocks * n) if k % n != observer]
    a = sympy.Matrix(rows)[:, keep]
    shift = sympy.Matrix([1 if keep[k] % n == u else 0 for k in range(len(keep))])
    a_u = a * shift
    return (a_u.T * (a * a.T).pinv() * a_u)[0, 0]


@pytest.mark.parametrize(
    "graph, steps, observer, u, every_step",
    [
        (nx.bull_graph(), 3, 3, 4, False),
        (nx.bull_graph(), 3, 0, 4, False),
        (nx.path_graph(4), 3, 0, 2, True),
        (nx.cycle_graph(4), 3, 0, 2, True),
    ],
)
def test_leakage_equals_exact_rational_arithmetic(graph, steps, observer, u, every_step):
    topology = topologies.from_graph(graph)
    exact = _exact_leakage(topology, steps, observer, u, every_step)
    assert 0 < exact <= (steps if every_step else 1)
    leak = pairwise_leakage(
        topology, steps, noise="every_step" if every_step else "once", shift="constant"
    )
    assert leak[u, observer] == pytest.approx(float(exact), abs=LEAK_TOL)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 7),
    p=st.floats(0.3, 1.0),
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 5),
    gamma=st.sampled_from([1.0, 0.5]),
)
def test_noise_once_never_exceeds_local_dp_and_grows_with_steps(n, p, seed, steps, gamma):
    graph = nx.gnp_random_graph(n, p, seed=seed)
    graph.add_edges_from((i, i + 1) for i in range(n - 1))  # connected
    topology = topologies.from_graph(graph)
    eps = pairwise_epsilon(topology, steps, SIGMA, DELTA, gamma=gamma)
    off = ~np.eye(n, dtype=bool)
    assert (eps[off] >= 0).all() and (eps[off] <= local_epsilon(steps, SIGMA, DELTA)).all()
    longer = pairwise_leakage(topology, steps + 1, gamma=gamma)
    # The view of T steps is part of the view of T + 1 steps (post-processing).
    assert (longer[off] >= pairwise_leakage(topology, steps, gamma=gamma)[off] - LEAK_TOL).all()
    every = pairwise_leakage(topology, steps, noise="every_step", gamma=gamma)
    assert (every[off] <= steps).all()
