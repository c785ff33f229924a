"""Pairwise network differential privacy of noisy linear gossip (the Muffliato analysis).

Cyffers, Even, Bellet, Hendrikx, "Muffliato: Peer-to-Peer Privacy Amplification for Decentralized
Optimization and Averaging", NeurIPS 2022. Setting: every peer adds Gaussian noise N(0, sigma^2)
once to its value, then T gossip steps x <- W x run. Peer v observes, at every step t < T, the
values (W^t x + W^t noise)_w of every w in its closed neighbourhood N(v) u {v}: its neighbours'
messages and its own value (v knows its own row). A message's dependence on u's value is
(W^t)_{w,u}; its noise has std sigma * ||row w of W^t||_2. Each message is a Gaussian mechanism
with respect to u, of Renyi divergence of order alpha

    alpha * Delta^2 * (W^t)_{w,u}^2 / (2 sigma^2 ||(W^t)_w||^2),

and the RDP of u towards v is the sum over every message v sees (composition: an upper bound,
since the messages share noise), times the number of rounds when the whole procedure is repeated
(e.g. once per training step with fresh noise). Each entry is linear in alpha, alpha * rho[u, v],
so `pairwise_rdp` returns rho (the RDP per unit of alpha). The diagonal (u = v: a peer's privacy
towards itself) is not defined and set to NaN.

(epsilon, delta) conversion: the classic one, epsilon = min over alpha > 1 of
RDP(alpha) + log(1/delta) / (alpha - 1), which for RDP(alpha) = alpha * rho has the closed form
rho + 2 sqrt(rho log(1/delta)) at alpha = 1 + sqrt(log(1/delta) / rho). It is minimised exactly,
not over a grid, and is looser than the conversion Opacus uses (Balle et al. 2020).

Scope: this covers *linear* gossip only, i.e. exact gossip, whose step x <- x + gamma (W x - x)
is mixing with W_gamma = (1 - gamma) I + gamma W (`gamma`). It does not cover PowerGossip, whose
messages M_j Q depend on factors built from the models themselves (nonlinear in the data, so the
sensitivity analysis above does not apply), nor compressed gossip (Choco, DeepSqueeze) with
nonlinear compressors, nor the gradient steps taken between gossip rounds during training, nor
colluding peers.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["dp_epsilon", "mixing_matrix", "pairwise_epsilon", "pairwise_privacy_loss", "pairwise_rdp"]


def mixing_matrix(topology, gamma: float = 1.0) -> np.ndarray:
    """W_gamma = (1 - gamma) I + gamma W: the linear map one exact-gossip step applies."""
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    w = np.asarray(topology.W, dtype=np.float64)
    return (1.0 - gamma) * np.eye(w.shape[0]) + gamma * w


def _check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value \
            or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def pairwise_rdp(topology, steps: int, sigma: float, sensitivity: float = 1.0, *,
                 gamma: float = 1.0, rounds: int = 1) -> np.ndarray:
    """rho[u, v]: the Renyi-DP of peer u towards observer v per unit of alpha (RDP(alpha) =
    alpha * rho[u, v]) after `steps` noisy gossip steps, composed over `rounds` repetitions.

    See the module docstring for the analysis and what it covers; the diagonal is NaN.
    """
    steps = _check_count("steps", steps, 1)
    rounds = _check_count("rounds", rounds, 1)
    sigma = _check_positive("sigma", sigma)
    sensitivity = _check_positive("sensitivity", sensitivity)
    w = mixing_matrix(topology, gamma)
    n = w.shape[0]
    closed = (np.abs(np.asarray(topology.W)) > 0) | np.eye(n, dtype=bool)  # closed[v, w]: v sees w
    # leak[w, u] = sum over t < T of (W^t)_{w,u}^2 / ||(W^t)_w||^2: what w's messages reveal of u.
    leak = np.zeros((n, n))
    power = np.eye(n)
    for _ in range(steps):
        row_norms = (power ** 2).sum(axis=1, keepdims=True)
        leak += power ** 2 / row_norms
        power = w @ power
    rho = sensitivity ** 2 / (2 * sigma ** 2) * rounds * (leak.T @ closed.T.astype(np.float64))
    np.fill_diagonal(rho, np.nan)
    return rho


def dp_epsilon(rho, delta: float):
    """Epsilon at `delta` of RDP(alpha) = alpha * rho (array or number): rho + 2 sqrt(rho log(1/delta)),
    the classic conversion minimised exactly over alpha > 1; NaN stays NaN."""
    if isinstance(delta, bool) or not 0 < float(delta) < 1:
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    rho = np.asarray(rho, dtype=np.float64)
    return rho + 2.0 * np.sqrt(rho * math.log(1.0 / float(delta)))


def pairwise_epsilon(topology, steps: int, sigma: float, delta: float, sensitivity: float = 1.0,
                     *, gamma: float = 1.0, rounds: int = 1) -> np.ndarray:
    """epsilon[u, v] at `delta`: the (epsilon, delta)-DP of u towards v (`pairwise_rdp`, then
    `dp_epsilon`); the diagonal is NaN."""
    return dp_epsilon(pairwise_rdp(topology, steps, sigma, sensitivity, gamma=gamma,
                                   rounds=rounds), delta)

#: The name the project's API uses for the pairwise Rényi-DP matrix of noisy exact gossip.
pairwise_privacy_loss = pairwise_rdp
