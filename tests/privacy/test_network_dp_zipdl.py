"""ZIP-DL's zero-sum noise in the exact network-DP accountant (`network_dp.zero_sum_matrix` and
``zero_sum=`` of `pairwise_leakage`): the accountant's linear model is what exact gossip with
`ZeroSumNoise` sends, a hand value, an independent pseudo-inverse, and that the extra noise never
raises the leakage."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import topologies
from gossip_powersgd import ExactGossip, LocalCluster
from gossip_powersgd.privacy import network_dp
from gossip_powersgd.privacy.mechanisms import zipdl
from gossip_powersgd.privacy.network_dp import pairwise_leakage, view_matrix, zero_sum_matrix
from gossip_powersgd.privacy.seeds import Randomness

U64 = 2.0**-53  # float64 unit roundoff
#: As in test_network_dp: a projection's squared norm from an SVD of O(10..300) unit rows rounds
#: to a few hundred eps; 1e-11 leaves a margin of 100.
LEAK_TOL = 1e-11
SEED, SIGMA_Z, DIM = 11, 0.7, 3


def _recorded_run(comm, steps, gamma, observer):
    """Exact gossip with ZIP-DL's hook on public keystreams (so the test can redraw every g);
    returns the initial values and, on the observer, every message received (step-major)."""
    g = torch.Generator().manual_seed(100 + comm.rank)
    x = [torch.randn(DIM, generator=g, dtype=torch.float64)]
    start = x[0].clone()
    gossip = ExactGossip(x, comm, gamma=gamma)
    gossip.edge_noise = zipdl.ZeroSumNoise(Randomness.public(SEED, comm.rank), SIGMA_Z)
    received = []
    original = comm.exchange

    def spy(send, recv, *args):
        out = original(send, recv, *args)
        received.append([recv[j].clone() for j in comm.neighbors])
        return out

    if comm.rank == observer:
        comm.exchange = spy
    for _ in range(steps):
        gossip.step()
    return start, received


@pytest.mark.parametrize(
    "graph, gamma",
    [(nx.cycle_graph(5), 1.0), (nx.house_graph(), 0.5), (nx.wheel_graph(6), 1.0)],
)
def test_the_accountants_linear_model_is_what_exact_gossip_with_zipdl_sends(graph, gamma):
    """Every message the observer receives equals A x(0) + sigma_z B g, with A and B built by the
    accountant (the observer's own columns kept) and g redrawn from each sender's keystream exactly
    as `zero_sum_noise` draws it: the accountant models this implementation (where the noise enters,
    the weights, the centring, the neighbour order), not another one."""
    topology, steps, observer = topologies.from_graph(graph), 4, 1
    results = LocalCluster(topology).run(_recorded_run, steps, gamma, observer)
    x0 = np.stack([r[0].numpy() for r in results])  # (n, DIM)
    a, peers, b, draws = network_dp._view(
        topology, steps, observer, noise="once", gamma=gamma, zero_sum=True, keep_observer=True
    )
    g = {}
    for t in range(steps):
        for j in range(topology.size):
            nbs = list(topology.neighbors(j))
            key = Randomness.public(SEED, j)
            g[t, j] = key.normals(zipdl.ZIPDL_STREAM, t, n=len(nbs) * DIM).view(len(nbs), DIM)
    gvec = np.stack([g[t, j][list(topology.neighbors(j)).index(k)].numpy() for t, j, k in draws])
    expected = a @ x0[peers] + SIGMA_Z * b @ gvec
    got = np.concatenate([np.stack([m.numpy() for m in step]) for step in results[observer][1]])
    # Rounding, float64: the run's mixes add <= steps (deg + 2) terms of size <= `largest` per
    # message (the values, and sigma_z times draws); the check's dot products have k = A's and B's
    # columns terms, with coefficient rows of l1 norm <= 1 (A: stochastic) and <= 2 steps (B: the
    # centring's l1 norm is <= 2 per draw and step). Both sides' error bounds, summed, times 4.
    largest = float(np.abs(x0).max() + SIGMA_Z * np.abs(gvec).max())
    k = a.shape[1] + b.shape[1]
    run = 2 * steps * (max(topology.degrees) + 2) * U64 * largest
    check = k * U64 * largest * (1 + 2 * steps)
    assert np.abs(got - expected).max() <= 4 * (run + check)
    # and the draws matter: without them the messages are far off
    assert np.abs(got - a @ x0[peers]).max() > 1e-3


def test_one_step_on_three_peers_matches_the_hand_value():
    """ring:3 (every weight 1/3), one step, noise once: peer 1 sends x_1 + eta_1 + n_10 with
    n_10 = (g_10 - g_12) / 2, of variance sigma_z^2 / 2, independent of peer 2's message; so
    l = sigma^2 / (sigma^2 + sigma_z^2 / 2) = 1 / (1 + rho^2 / 2)."""
    for rho in (0.0, 0.5, 1.0, 3.0):
        leak = pairwise_leakage(topologies.ring(3), 1, zero_sum=rho)
        assert leak[1, 0] == pytest.approx(1 / (1 + rho**2 / 2), abs=LEAK_TOL)
        assert leak[2, 0] == pytest.approx(1 / (1 + rho**2 / 2), abs=LEAK_TOL)


@pytest.mark.parametrize(
    "graph, steps, noise", [(nx.cycle_graph(6), 4, "every_step"), (nx.house_graph(), 3, "once")]
)
def test_leakage_equals_an_independent_pseudo_inverse(graph, steps, noise):
    """The constant-shift leakage s^T (A A^T + rho^2 B B^T)^+ s (s = sum of u's columns) computed
    with numpy's pinv of the covariance, not the row-space basis of [A, rho B]."""
    topology, rho, observer = topologies.from_graph(graph), 1.7, 0
    a, peers = view_matrix(topology, steps, observer, noise=noise)
    b, _ = zero_sum_matrix(topology, steps, observer, noise=noise)
    cov = a @ a.T + rho**2 * b @ b.T
    leak = pairwise_leakage(topology, steps, noise=noise, zero_sum=rho, shift="constant")
    for u in range(1, topology.size):
        s = a[:, peers == u].sum(axis=1)
        # pinv's cut-off (rcond 1e-15 of ||cov||) and the covariance's condition number (the rows
        # are not normalised here) make this check looser than LEAK_TOL: 1e-8 relative.
        direct = float(s @ np.linalg.pinv(cov, rcond=1e-12, hermitian=True) @ s)
        assert leak[u, observer] == pytest.approx(direct, rel=1e-8, abs=1e-10)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 6),
    p=st.floats(0.3, 1.0),
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 4),
    rho=st.floats(0.1, 10.0),
    noise=st.sampled_from(["once", "every_step"]),
)
def test_zero_sum_noise_never_raises_the_leakage(n, p, seed, steps, rho, noise):
    """Independent extra noise in the view is post-processing of the view without it: the leakage
    with ZIP-DL is at most the leakage without, and falls as rho grows."""
    graph = nx.gnp_random_graph(n, p, seed=seed)
    graph.add_edges_from((i, i + 1) for i in range(n - 1))  # connected
    topology = topologies.from_graph(graph)
    off = ~np.eye(n, dtype=bool)
    plain = pairwise_leakage(topology, steps, noise=noise)
    zipped = pairwise_leakage(topology, steps, noise=noise, zero_sum=rho)
    more = pairwise_leakage(topology, steps, noise=noise, zero_sum=2 * rho)
    tol = LEAK_TOL * max(1, steps)
    assert (zipped[off] <= plain[off] + tol).all()
    assert (more[off] <= zipped[off] + tol).all()
    assert (zipped[off] >= 0).all()


def test_huge_zero_sum_noise_hides_a_peer_from_one_observer():
    """Each message carries its own noise and only the network sum is noise-free: one observer's
    leakage goes to 0 as rho grows (ring:8, 6 noisy steps): l(rho) ~ 1/rho^2."""
    ring = topologies.ring(8)
    small = pairwise_leakage(ring, 6, noise="every_step", zero_sum=10.0, shift="constant")
    large = pairwise_leakage(ring, 6, noise="every_step", zero_sum=100.0, shift="constant")
    assert 0 < large[1, 0] < small[1, 0] / 50


def test_zero_sum_inputs_are_checked():
    with pytest.raises(ValueError, match="zero_sum must be a finite number >= 0"):
        pairwise_leakage("ring:4", 2, zero_sum=-1.0)
    with pytest.raises(ValueError, match="zero_sum must be a finite number >= 0"):
        pairwise_leakage("ring:4", 2, zero_sum=math.inf)
    with pytest.raises(ValueError, match="accounted on a static topology"):
        pairwise_leakage("one_peer_exponential:8", 2, zero_sum=1.0)
    # rho = 0 is the accountant without ZIP-DL
    assert np.array_equal(
        pairwise_leakage("ring:5", 3, zero_sum=0.0), pairwise_leakage("ring:5", 3), equal_nan=True
    )


def test_zipdl_epsilons_are_the_local_bound_and_credit_the_zero_sum_noise_in_the_network_figure():
    """`zipdl.zipdl_epsilons` on ring:8: the guarantee is DP-SGD's local bound per pair (the
    network figure is no guarantee for training), and ZIP-DL's network figure is below
    Muffliato's (the same view without the draws) for every peer."""
    from gossip_powersgd.privacy.mechanisms import muffliato

    ring, steps, sigma, q = topologies.ring(8), 8, 1.0, 0.1
    rho = zipdl.noise_ratio(0.01, lr=0.5, noise_multiplier=sigma, clip=1.0, batch=50)
    assert rho == pytest.approx(0.01 * 50 / 0.5)
    zipped = zipdl.zipdl_epsilons(ring, steps, sigma, q, 1e-5, 0, ratio=rho, network=True)
    plain = muffliato.muffliato_epsilons(ring, steps, sigma, q, 1e-5, 0, network=True)
    for u, row in zipped.items():
        assert row["epsilon"] == row["local"] and "not valid" in row["network_label"]
        assert row["network"] < plain[u]["network"]
    off = zipdl.zipdl_epsilons(ring, steps, sigma, q, 1e-5, 0, ratio=rho, network=False)
    assert all(math.isnan(r["network"]) and r["epsilon"] == r["local"] for r in off.values())
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        zipdl.noise_ratio(0.01, lr=0.0, noise_multiplier=1.0, clip=1.0, batch=50)
