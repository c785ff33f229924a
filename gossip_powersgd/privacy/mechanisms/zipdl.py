"""ZIP-DL: a different noisy message for each neighbour, the noises of one peer summing to zero.

Biswas, Frey, Gaudel, Kermarrec, Lerévérend, Pires, Sharma, Taïani, "Low-Cost Privacy-Preserving
Decentralized Learning" (arXiv 2403.11795, PoPETs 2025). Peer i draws, at every gossip message,
g_j ~ N(0, sigma^2 I) for each neighbour j (from its own secret keystream, never the shared seed)
and sends neighbour j its message plus

    n_ij = g_j - sum_k W[i,k] g_k / sum_k W[i,k],     so that   sum_j W[i,j] n_ij = 0

(with equal weights: ZIP-DL's re-centring ``noises -= mean``). Every single message is noisy (std
sigma sqrt(1 - 2 w_j / S + sum_k w_k^2 / S^2) per coordinate, S = sum_k w_k; sigma sqrt(1 - 1/d)
for d equal weights), while the network average is unaffected:

* exact gossip: x_i += gamma sum_j W[i,j] (x_j + n_ji - x_i), so the sum over peers moves by
  gamma sum_j sum_i W[j,i] n_ji = 0 (W symmetric);
* PowerGossip: the noise is added to the projected messages per edge (M Q or M^T P, and the exactly
  gossiped tensors), both ends form the edge's factor from the same noisy products, so every edge
  still adds +U at one end and -U at the other: the average is kept for any noise; the weighted
  zero sum makes the exactly gossiped part's noise cancel as in exact gossip.

The noise enters through the algorithms' one per-edge hook, `GossipAlgorithm.edge_noise`.

Accounting (`zipdl_epsilons`), per pair (victim u, observer v), two figures, the first the
guarantee:

* local: the peer's ZIP-DL noise is added on top of DP-SGD (clipping and Gaussian noise on its own
  gradient, `dpsgd`), so every message is post-processing of DP-SGD's output plus independent
  noise: DP-SGD's subsampled epsilon holds against every peer, for exact gossip and PowerGossip;
* network (exact gossip only): observer v's whole view is linear in the other peers' DP-SGD noise
  and in their ZIP-DL draws g, V = A z + B g + known (`network_dp.zero_sum_matrix`), one Gaussian
  of covariance sigma^2 (A A^T + rho^2 B B^T), rho = sigma_z / (lr sigma C / batch) the ZIP-DL std
  over DP-SGD's in model units (`noise_ratio`); its exact Rényi divergence towards u is
  `network_dp`'s with B's columns added (the zero-sum noise of one peer's messages is correlated,
  and every step's noise keeps flowing into later messages: both are in B). This figure takes
  each step's contribution as fixed in advance and ignores the evaluation's all-reduce of the
  average model: like Muffliato's, it is no guarantee for training (`muffliato.NETWORK_LABEL`),
  only a comparison.

The paper (PoPETs 2025) states its own guarantee for the zero-sum noise; this module does not use
it: the figure above is computed from the observer's exact view of this implementation (a test
checks the accountant's linear model against the messages exact gossip with `ZeroSumNoise`
actually sends). Not covered: PowerGossip's messages (factors built from the noisy models are not
linear in the noise) and observers that pool their views; against those, the local bound holds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch

from gossip_powersgd.privacy.seeds import Randomness
from gossip_powersgd.privacy.mechanisms.registry import Mechanism, register_mechanism

if TYPE_CHECKING:
    from topologies import AnyTopology

    from gossip_powersgd.comm.base import Comm

__all__ = [
    "ZIPDL_STREAM",
    "ZeroSumNoise",
    "message_std",
    "noise_ratio",
    "zero_sum_noise",
    "zipdl_epsilons",
]

#: The keystream tag of ZIP-DL's noise (apart from DP-SGD's noise and sampling streams).
ZIPDL_STREAM = 0x21FD1


def zero_sum_noise(
    randomness: Randomness, counter: int, weights: Sequence[float], numel: int, sigma: float
) -> torch.Tensor:
    """(deg, numel) float64 noise, row j for neighbour j, with sum_j weights[j] row_j = 0 up to
    float64 rounding; the label (ZIPDL_STREAM, counter) of the peer's own keystream."""
    deg = len(weights)
    if deg < 2:
        raise ValueError(
            "ZIP-DL's zero-sum noise needs at least two neighbours (with one, the "
            "only message's noise must be zero): use a topology of degree >= 2"
        )
    w = torch.tensor([float(v) for v in weights], dtype=torch.float64)
    if not bool((w > 0).all()):
        raise ValueError(f"ZIP-DL needs positive gossip weights, got {w.tolist()}")
    g = randomness.normals(ZIPDL_STREAM, counter, n=deg * numel).view(deg, numel)
    centre = (w[:, None] * g).sum(0) / w.sum()
    return float(sigma) * (g - centre)


def message_std(weights: Sequence[float], sigma: float) -> list:
    """The std per coordinate of each neighbour's noise: sigma sqrt(1 - 2 w_j/S + sum w^2/S^2)."""
    total = sum(weights)
    squares = sum(v * v for v in weights) / total**2
    return [sigma * math.sqrt(1 - 2 * v / total + squares) for v in weights]


class ZeroSumNoise:
    """The `GossipAlgorithm.edge_noise` hook of ZIP-DL: adds `zero_sum_noise` to the send rows.

    `counter` is the algorithm's own count of messages (step, or half-step for PowerGossip), so a
    resumed run draws what the uninterrupted run would have (with ``dp_secret: run_dir``)."""

    def __init__(self, randomness: Randomness, sigma: float):
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"dp_zipdl_sigma must be a finite number >= 0, got {sigma!r}")
        self.randomness = randomness
        self.sigma = float(sigma)

    def __call__(self, counter: int, neighbors, weights, rows: torch.Tensor) -> None:
        if self.sigma == 0:
            return
        noise = zero_sum_noise(self.randomness, counter, weights, rows.shape[1], self.sigma)
        rows.add_(noise.to(device=rows.device, dtype=rows.dtype))


def noise_ratio(
    sigma_z: float, lr: float, noise_multiplier: float, clip: float, batch: float
) -> float:
    """rho = sigma_z / (lr sigma C / batch): ZIP-DL's per-draw std over the std of DP-SGD's noise on
    the model (noise sigma C on the clipped sum, divided by the expected batch, times the step)."""
    for name, value in (
        ("lr", lr),
        ("noise_multiplier", noise_multiplier),
        ("clip", clip),
        ("batch", batch),
    ):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if not (isinstance(sigma_z, (int, float)) and math.isfinite(sigma_z) and sigma_z >= 0):
        raise ValueError(f"sigma_z must be a finite number >= 0, got {sigma_z!r}")
    return float(sigma_z) * float(batch) / (float(lr) * float(noise_multiplier) * float(clip))


def zipdl_epsilons(
    topology: AnyTopology,
    steps: int,
    sigma: float,
    sample_rate: float,
    delta: float,
    observer: int,
    *,
    ratio: float,
    network: bool,
    gamma: float = 1.0,
) -> dict:
    """{u: {"local", "network", "epsilon", ...}} towards `observer` (see the module docstring):
    DP-SGD's subsampled epsilon (the guarantee, ``"epsilon"``), the exact view figure with
    ZIP-DL's noise at `ratio` (`noise_ratio`; NaN when `network` is False), labelled as no
    guarantee for training (`muffliato.muffliato_epsilons`)."""
    from gossip_powersgd.privacy.mechanisms.muffliato import muffliato_epsilons

    return muffliato_epsilons(
        topology,
        steps,
        sigma,
        sample_rate,
        delta,
        observer,
        network=network,
        gamma=gamma,
        zero_sum=ratio,
    )


@register_mechanism
class ZipDL(Mechanism):
    name = "zipdl"
    summary = "zero-sum noise per edge on the messages (dp_zipdl_sigma), on top of DP-SGD"
    keys = ("dp_zipdl_sigma",)
    needs = "supports_edge_noise"
    static_graph = True
    network_bound = True

    def check_config(self, config) -> None:
        if config.dp_zipdl_sigma is None:
            raise ValueError(
                "dp_mechanism: zipdl needs dp_zipdl_sigma (the std of its per-edge "
                "zero-sum noise on each message coordinate)"
            )
        sigma = float(config.dp_zipdl_sigma)
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"bad value for 'dp_zipdl_sigma': {sigma!r} (must be finite and >= 0)")

    def attach(self, config, comm: "Comm", dp, algorithm, randomness, resume: bool):
        if len(comm.neighbors) < 2:
            raise ValueError(
                "dp_mechanism: zipdl needs every peer to have >= 2 neighbours (one "
                "message cannot carry zero-sum noise): use another topology"
            )
        algorithm.edge_noise = ZeroSumNoise(randomness, float(config.dp_zipdl_sigma))
        return algorithm.edge_noise
