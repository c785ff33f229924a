"""DECOR (`privacy.mechanisms.decor`): pairwise noise that cancels in the network's sum and is fresh
every step, the SecLDP accountant against closed forms on the complete graph, the ring and the
path, its limits, and the refusal of DECOR without independent noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy.mechanisms import decor, pair_secrets
from mechanism_fixtures import small_config

U64 = 2.0**-53  # float64 unit roundoff


def test_pairwise_noise_cancels_in_the_sum_and_is_fresh_every_step():
    sigma, numel = 3.0, 2000
    topology = topologies.parse("small_world:8:4:0.5")

    def run(comm):
        keys = pair_secrets.agree_pair_keys(comm, "os")
        noise = decor.PairwiseNoise(comm.rank, keys, sigma, 1.0, "os")
        like = torch.zeros(numel)
        return [noise(t, 0, like) for t in range(2)]

    results = LocalCluster(topology).run(run)
    edges = len(list(topology.edges()))
    for t in range(2):
        total = torch.stack([r[t] for r in results]).sum(0)
        largest = max(float(r[t].abs().max()) for r in results)
        # 2|E| float64 draws of size <= 8.6 sigma, each peer's sum rounded, then n sums rounded
        assert float(total.abs().max()) <= (2 * edges + 8) * U64 * max(largest, 8.6 * sigma)
    for r, rank in zip(results, range(8)):
        deg = len(list(topology.neighbors(rank)))
        assert abs(float(r[0].std()) / (sigma * math.sqrt(deg)) - 1) < 5 / math.sqrt(2 * numel)
        corr = float(torch.corrcoef(torch.stack([r[0], r[1]]))[0, 1])
        assert abs(corr) < 5 / math.sqrt(numel)  # a fresh draw each step, not the same one


def complete_closed_form(n, a, b):
    """[Sigma^-1]_ii for K_n, Sigma = a I + b (n I - J): eigenvalue a on 1, a + b n on 1-perp."""
    return (1 - 1 / n) / (a + b * n) + 1 / (a * n)


def ring_closed_form(n, a, b):
    """[Sigma^-1]_ii for the ring C_n: (1/n) sum_k 1 / (a + b (2 - 2 cos(2 pi k / n)))."""
    return sum(1 / (a + b * (2 - 2 * math.cos(2 * math.pi * k / n))) for k in range(n)) / n


def path_closed_form(m, a, b, i):
    """[Sigma^-1]_ii for the path P_m (the ring without one node): Laplacian eigenvalues
    2 - 2 cos(pi k / m), eigenvectors cos(pi k (i + 1/2) / m), normalised."""
    total = 0.0
    for k in range(m):
        v = np.cos(np.pi * k * (np.arange(m) + 0.5) / m)
        v /= np.linalg.norm(v)
        total += v[i] ** 2 / (a + b * (2 - 2 * math.cos(math.pi * k / m)))
    return total


@pytest.mark.parametrize("n", [4, 9])
@pytest.mark.parametrize("sigma_ind, sigma_cor", [(1.0, 0.5), (0.3, 4.0)])
def test_secldp_closed_forms_on_the_complete_graph_and_the_ring(n, sigma_ind, sigma_cor):
    a, b, clip = sigma_ind**2, sigma_cor**2, 0.7
    # A linear solve's relative error is <= ~ n u cond(Sigma), cond = (a + b lambda_max) / a.
    for spec, form, lam in (
        (f"complete:{n}", complete_closed_form(n, a, b), n),
        (f"ring:{n}", ring_closed_form(n, a, b), 4),
    ):
        tol = 10 * n * U64 * (a + b * lam) / a
        adjacency = decor.adjacency_of(topologies.parse(spec))
        assert decor.decor_rdp(adjacency, sigma_ind, sigma_cor, clip) == pytest.approx(
            2 * clip**2 * form, rel=tol
        )
    # Against a peer that holds its own keys: K_n loses a node (K_{n-1}), the ring becomes a path.
    ring = decor.adjacency_of(topologies.parse(f"ring:{n}"))
    tol = 10 * n * U64 * (a + 4 * b) / a
    for victim in range(1, n):
        z = decor.effective_noise(ring, sigma_ind, sigma_cor, victim, adversary=0)
        assert 1 / z**2 == pytest.approx(path_closed_form(n - 1, a, b, victim - 1), rel=tol)
    complete = decor.adjacency_of(topologies.parse(f"complete:{n}"))
    z = decor.effective_noise(complete, sigma_ind, sigma_cor, 1, adversary=0)
    assert 1 / z**2 == pytest.approx(complete_closed_form(n - 1, a, b), rel=tol)


def test_secldp_limits_and_cross_check_with_dp_accounting():
    ring = decor.adjacency_of(topologies.parse("ring:8"))
    # No correlated noise: local DP-SGD (z = sigma_ind); a lot: the 7 others' noise averaged.
    assert decor.effective_noise(ring, 0.8, 0.0, 2, 1) == pytest.approx(0.8, rel=1e-14)
    # (the remainder, sum over the path's other eigenvalues of v^2 / (b lambda) with lambda_1 =
    # 2 - 2 cos(pi / 7) ~ 0.2, is ~ 1e-7 relative; the solve's error ~ 7 u cond, cond ~ 6e8)
    assert decor.effective_noise(ring, 0.8, 1e4, 2, 1) == pytest.approx(
        0.8 * math.sqrt(7), rel=1e-5
    )
    rdp = decor.secldp_epsilon(ring, 0.5, 2.0, 2, 1, 0.05, 300, 1e-5, "rdp")
    pld = decor.secldp_epsilon(ring, 0.5, 2.0, 2, 1, 0.05, 300, 1e-5, "pld")
    # PLD is tighter than RDP's conversion, by 8-21 % on DP-SGD settings (privacy reference)
    assert 0.7 * rdp <= pld <= rdp


def test_decor_without_independent_noise_is_refused():
    """SecLDP needs sigma_ind > 0: with none, a peer whose every pair key a neighbour holds adds no
    noise that neighbour cannot remove, and no epsilon holds."""
    from gossip_powersgd.privacy.mechanisms import validate_mechanism_config

    config = small_config(dp_mechanism="decor", dp_decor_sigma_cor=3.0, dp_noise_multiplier=0.0)
    with pytest.raises(ValueError, match=r"dp_mechanism: decor needs dp_noise_multiplier > 0"):
        validate_mechanism_config(config)
