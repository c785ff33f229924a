"""DECOR: antisymmetric pairwise noise on top of small independent noise, and its accountant.

Allouah, Koloskova, El Firdoussi, Jaggi, Guerraoui, "The Privacy Power of Correlated Noise in
Decentralized Learning", ICML 2024. Every step t, peer i's noisy gradient sum is

    sum_{x in batch} clip(grad x) + v_i(t) + sum_{j in N(i)} s_ij v_ij(t),
    v_i(t) ~ N(0, (sigma_ind C)^2 I),   v_ij(t) ~ N(0, (sigma_cor C)^2 I),   s_ij = -s_ji = +-1

(+1 at the smaller rank). v_i is DP-SGD's noise, from i's own secret keystream; v_ij is drawn by
both i and j alike from the keystream of their pair key (`pair_secrets`: Diffie-Hellman, never
derivable by a third peer), fresh at every step and for every parameter tensor (label (DECOR_STREAM,
t, k)). So v_ij s_ij + v_ji s_ji = 0: the correlated noise cancels in the sum over peers, and the
network average of the updates carries only the independent noise. The noise is on the local update,
before the optimizer step and before anything is sent, so it works with every algorithm acting on
parameters (exact gossip, PowerGossip, Choco); for PowerGossip it enters the local model before any
difference is projected.

SecLDP accounting (Algorithm 2 of the paper): an adversary that sees every peer's noisy update and
knows its own pair keys faces, per step and per coordinate, the Gaussian noise vector over the other
peers N(0, C^2 Sigma), Sigma = sigma_ind^2 I + sigma_cor^2 L_H, L_H the Laplacian of the edges whose
key it does not hold (the graph without the adversary's node: its own keys are its own edges). A
record of victim u shifts coordinate u by at most C (add/remove), so each step is a Gaussian
mechanism of noise multiplier z_u = 1 / sqrt([Sigma^-1]_uu) (whitening), subsampled at the victim's
rate q: epsilon is the subsampled Gaussian's, composed over the run (`secldp_epsilon`), by Opacus'
RDP and by dp-accounting's PLD. Whatever the algorithm, every message is post-processing of all the
noisy updates, so the bound holds for the adversary's real view. The paper's formula
2 C^2 max_u [Sigma^-1]_uu (`decor_rdp`) is the per-step RDP at order 1 scale with sensitivity 2C
(replace-one) and the full graph's Laplacian (an eavesdropper with no key).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, Optional, Sequence

import numpy as np
import torch

from gossip_powersgd.privacy.seeds import Randomness
from gossip_powersgd.privacy.mechanisms.registry import Mechanism, register_mechanism

if TYPE_CHECKING:
    from topologies import Topology

    from gossip_powersgd.comm.base import Comm

__all__ = [
    "DECOR_STREAM",
    "PairwiseNoise",
    "decor_rdp",
    "effective_noise",
    "laplacian",
    "secldp_epsilon",
    "secldp_matrix",
]

#: The keystream tag of the pairs' correlated noise.
DECOR_STREAM = 0xDEC0

# ---- the mechanism ----------------------------------------------------------------------------


class PairwiseNoise:
    """`DPSGD.extra_noise` for DECOR: sum_j s_ij v_ij(step, k), float64, in units of the clipped
    sum (std sigma_cor C per pair). `keys` maps each neighbour to the pair key."""

    def __init__(
        self, rank: int, keys: Dict[int, bytes], sigma_cor: float, max_grad_norm: float, kind: str
    ):
        if not (
            isinstance(sigma_cor, (int, float)) and math.isfinite(sigma_cor) and sigma_cor >= 0
        ):
            raise ValueError(f"dp_decor_sigma_cor must be a finite number >= 0, got {sigma_cor!r}")
        self.rank = int(rank)
        self.std = float(sigma_cor) * float(max_grad_norm)
        self.pairs = [
            (j, 1.0 if self.rank < j else -1.0, Randomness(key, kind))
            for j, key in sorted(keys.items())
        ]

    def pair_noise(self, j: int, step: int, k: int, numel: int) -> torch.Tensor:
        """v_ij(step, k) as drawn at both ends (before the sign), flat float64."""
        for other, _, stream in self.pairs:
            if other == j:
                return self.std * stream.normals(DECOR_STREAM, step, k, n=numel)
        raise KeyError(f"peer {self.rank} shares no key with {j}")

    def __call__(self, step: int, k: int, like: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(like.numel(), dtype=torch.float64)
        if self.std == 0:
            return total.view(like.shape).to(like.device)
        for _, sign, stream in self.pairs:
            total.add_(stream.normals(DECOR_STREAM, step, k, n=like.numel()), alpha=sign * self.std)
        return total.view(like.shape).to(like.device)


# ---- the accountant ---------------------------------------------------------------------------


def laplacian(adjacency) -> np.ndarray:
    """D - A of a symmetric 0/1 (or weighted) adjacency matrix, its diagonal ignored."""
    a = np.array(adjacency, dtype=np.float64)
    np.fill_diagonal(a, 0.0)
    if not np.allclose(a, a.T):
        raise ValueError("DECOR's pairs need an undirected graph (a symmetric adjacency)")
    return np.diag(a.sum(axis=1)) - a


def secldp_matrix(
    adjacency, sigma_ind: float, sigma_cor: float, adversary: Optional[int] = None
) -> np.ndarray:
    """Sigma^-1 over the peers the adversary does not control, Sigma = sigma_ind^2 I + sigma_cor^2 L.

    `adversary` None: an eavesdropper that holds no key (the full graph's L, the paper's setting);
    a rank: that peer, which knows its own noise and its pair keys, so its row and column go (the
    other peers' noise is what remains: the Laplacian of the graph without it). Returned as the
    full n x n matrix with NaN in the adversary's row and column."""
    if not sigma_ind > 0:
        raise ValueError(
            f"SecLDP needs independent noise sigma_ind > 0 (with none, a peer whose "
            f"every pair key is known has no noise), got {sigma_ind}"
        )
    a = np.array(adjacency, dtype=np.float64)
    n = a.shape[0]
    keep = [u for u in range(n) if u != adversary]
    lap = laplacian(a[np.ix_(keep, keep)])
    sigma = sigma_ind**2 * np.eye(len(keep)) + sigma_cor**2 * lap
    # Sigma >= sigma_ind^2 I is well conditioned for moderate sigma_cor / sigma_ind: a Cholesky
    # solve is backward stable (relative error ~ n eps cond(Sigma)).
    inverse = np.linalg.solve(sigma, np.eye(len(keep)))
    out = np.full((n, n), np.nan)
    out[np.ix_(keep, keep)] = inverse
    return out


def decor_rdp(adjacency, sigma_ind: float, sigma_cor: float, clip: float) -> float:
    """The paper's per-step RDP factor 2 C^2 max_u [Sigma^-1]_uu (RDP(alpha) = alpha times it),
    full-graph Laplacian, no subsampling: `utils/dp_account.py`'s ``rdp_account`` at precision 0."""
    inverse = secldp_matrix(adjacency, sigma_ind, sigma_cor)
    return 2.0 * clip**2 * float(np.nanmax(np.diag(inverse)))


def effective_noise(
    adjacency, sigma_ind: float, sigma_cor: float, victim: int, adversary: Optional[int] = None
) -> float:
    """z = 1 / sqrt([Sigma^-1]_vv): the noise multiplier of the whitened per-step Gaussian
    mechanism of `victim` towards `adversary` (sensitivity C, noise in units of C)."""
    if victim == adversary:
        raise ValueError("a peer is not its own adversary")
    value = secldp_matrix(adjacency, sigma_ind, sigma_cor, adversary)[victim, victim]
    return 1.0 / math.sqrt(float(value))


def secldp_epsilon(
    adjacency,
    sigma_ind: float,
    sigma_cor: float,
    victim: int,
    adversary: Optional[int],
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
) -> float:
    """Epsilon at `delta` of `victim` towards `adversary` after `steps` Poisson-subsampled steps:
    the subsampled Gaussian of `effective_noise`, by the project's accountant (``rdp``: Opacus;
    ``pld``: dp-accounting's privacy-loss distributions, independent of Opacus)."""
    from gossip_powersgd.privacy.accounting import epsilon, make_accountant, pld_epsilon

    z = effective_noise(adjacency, sigma_ind, sigma_cor, victim, adversary)
    history = [(z, float(sample_rate), int(steps))]
    if accountant == "pld":
        return pld_epsilon(history, delta)
    check = make_accountant(accountant)
    check.history = history
    return epsilon(check, delta)


def adjacency_of(topology: Topology) -> np.ndarray:
    """The 0/1 adjacency of a `topologies.Topology` (its W's off-diagonal support)."""
    w = np.asarray(topology.W, dtype=np.float64)
    a = (np.abs(w) > 0).astype(np.float64)
    np.fill_diagonal(a, 0.0)
    return a


def sigma_ind_for_target(
    target: float,
    adjacency,
    sigma_cor_ratio: float,
    sample_rate: float,
    steps: int,
    delta: float,
    pairs: Sequence[tuple],
) -> float:
    """The sigma_ind (with sigma_cor = ratio x sigma_ind) that ends the worst of the (victim,
    adversary) `pairs` at `target` (bisection on log sigma, 1e-3 relative; RDP accountant)."""

    def worst(s: float) -> float:
        return max(
            secldp_epsilon(adjacency, s, sigma_cor_ratio * s, u, v, sample_rate, steps, delta)
            for u, v in pairs
        )

    lo, hi = 1e-2, 1e-2
    while worst(hi) > target:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"DECOR cannot reach epsilon {target:g}: raise the target")
    while hi / lo > 1 + 1e-3:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if worst(mid) > target else (lo, mid)
    return hi


@register_mechanism
class Decor(Mechanism):
    name = "decor"
    summary = (
        "antisymmetric pairwise noise from Diffie-Hellman pair keys (dp_decor_sigma_cor) on top "
        "of DP-SGD's noise, then sigma_ind"
    )
    keys = ("dp_decor_sigma_cor",)
    needs = "supports_update_noise"
    static_graph = True

    def check_config(self, config) -> None:
        if config.dp_noise_multiplier is not None and not config.dp_noise_multiplier > 0:
            raise ValueError(
                "dp_mechanism: decor needs dp_noise_multiplier > 0 (sigma_ind, the independent "
                "noise): without it a peer's pair noise is all a neighbour holding its keys must "
                "remove, and SecLDP gives no epsilon; set dp_noise_multiplier (e.g. 0.5)"
            )
        if config.dp_decor_sigma_cor is None:
            raise ValueError(
                "dp_mechanism: decor needs dp_decor_sigma_cor (the pairs' noise "
                "multiplier; dp_noise_multiplier is the independent one)"
            )
        sigma = float(config.dp_decor_sigma_cor)
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(
                f"bad value for 'dp_decor_sigma_cor': {sigma!r} (must be finite and >= 0)"
            )
        if config.dp_target_epsilon is not None:
            raise ValueError(
                "dp_mechanism: decor takes dp_noise_multiplier (sigma_ind) and "
                "dp_decor_sigma_cor, not dp_target_epsilon (solve them for a target "
                "with privacy.mechanisms.decor.sigma_ind_for_target)"
            )

    def attach(self, config, comm: "Comm", dp, algorithm, randomness, resume: bool):
        from gossip_powersgd.privacy.mechanisms.pair_secrets import agree_pair_keys

        kind = randomness.kind
        keys = agree_pair_keys(comm, kind, seed=config.seed, run_dir=config.out_dir, resume=resume)
        dp.extra_noise = PairwiseNoise(
            comm.rank, keys, float(config.dp_decor_sigma_cor), dp.max_grad_norm, kind
        )
        return dp.extra_noise
