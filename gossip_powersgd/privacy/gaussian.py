"""The Gaussian mechanism's arithmetic that turns a view into (epsilon, delta) (`network_dp`):

- `worst_shift`: the worst squared mean shift, in units of Delta^2, of per-step record changes
  delta_s with ||delta_s|| <= Delta, given the Gram G of the victim's columns: the semidefinite
  program max tr(G X) over X >= 0 with diag(X) <= 1, bounded from above by a dual certificate;
- `gaussian_epsilon`: the exact (epsilon, delta) of a Gaussian mechanism of sensitivity/noise ratio
  mu (Balle & Wang 2018, analytic Gaussian);
- `dp_epsilon`: the classic conversion of RDP(alpha) = alpha rho, epsilon = rho + 2 sqrt(rho log(1/delta)).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_delta", "dp_epsilon", "gaussian_epsilon", "worst_shift"]


def check_delta(delta) -> float:
    """`delta` as a float, refusing anything outside (0, 1) in one line."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    return float(delta)


def worst_shift(g: np.ndarray, *, sweeps: int = 400) -> np.ndarray:
    """max tr(G X) over X >= 0 (PSD) with diag(X) <= 1: the worst squared shift, in units of
    Delta^2, of per-step changes delta_s with ||delta_s|| <= Delta, G the Gram of u's columns.
    `g` is one (T, T) matrix or a stack (P, T, T) (zero padding changes nothing); returns a float
    or a (P,) array.

    Exact when G >= 0 entrywise (then every delta_s equal is optimal: 1^T G 1). Otherwise the
    Burer-Monteiro coordinate ascent (the "mixing method", rank ceil(sqrt(2T)) + 1) finds
    X = V V^T, and the dual point y_i = G_ii + ||sum_{j != i} G_ij v_j||, raised by
    -lambda_min(Diag(y) - G) where negative, is feasible (Diag(y) >= G, so tr(G X) <= sum(y) for
    every feasible X): sum(y) is a valid upper bound, which is what is returned, never above
    T lambda_max(G).
    """
    g = np.asarray(g, dtype=np.float64)
    single = g.ndim == 2
    g = g[None] if single else g
    out = g.sum(axis=(1, 2))
    hard = np.flatnonzero((g < 0).any(axis=(1, 2)))
    if hard.size:
        out[hard] = _mixing_upper_bound(g[hard], sweeps)
    return float(out[0]) if single else out


def _mixing_upper_bound(g: np.ndarray, sweeps: int) -> np.ndarray:
    """`worst_shift` of a (P, T, T) stack, all P at once."""
    p, t, _ = g.shape
    diag = np.einsum("pii->pi", g).copy()
    off = g.copy()
    off[:, np.arange(t), np.arange(t)] = 0.0
    rank = min(t, int(math.ceil(math.sqrt(2 * t))) + 1)  # enough for a global optimum
    v = np.random.default_rng(0).standard_normal((p, t, rank))
    v /= np.linalg.norm(v, axis=2, keepdims=True)
    previous = np.full(p, -math.inf)
    for _ in range(sweeps):
        for i in range(t):
            pull = np.einsum("pj,pjk->pk", off[:, i], v)
            norm = np.linalg.norm(pull, axis=1, keepdims=True)
            v[:, i] = np.where(norm > 0, pull / np.where(norm > 0, norm, 1.0), v[:, i])
        value = np.einsum("pij,pjk,pik->p", g, v, v)
        if (value - previous <= 1e-12 * np.abs(value)).all():
            break
        previous = value
    y = diag + np.linalg.norm(off @ v, axis=2)
    dual = -g
    dual[:, np.arange(t), np.arange(t)] += y
    lam = np.linalg.eigvalsh(dual)[:, 0]
    upper = y.sum(axis=1) + t * np.maximum(0.0, -lam)
    return np.minimum(upper, t * np.linalg.eigvalsh(g)[:, -1])


def dp_epsilon(rho, delta: float):
    """Epsilon at `delta` of RDP(alpha) = alpha * rho (array or number): rho + 2 sqrt(rho log(1/delta)),
    the classic RDP conversion minimised exactly over alpha > 1; NaN stays NaN."""
    delta = check_delta(delta)
    rho = np.asarray(rho, dtype=np.float64)
    return rho + 2.0 * np.sqrt(rho * math.log(1.0 / delta))


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


#: Below -this, log Phi(x) comes from its asymptotic series: 0.5 erfc(-x / sqrt 2) would be a
#: subnormal (losing digits) from x = -37.5 and 0 from x = -38.5.
_LOG_PHI_SERIES = 30.0
#: math.exp overflows from 709.78; below this the product e^eps Phi(.) is computed as it reads.
_EXP_LIMIT = 700.0


def _log_phi(x: float) -> float:
    """log Phi(x) for x <= 0, with no underflow: directly down to -30, below it the asymptotic
    series log Phi(x) = -x^2/2 - log(-x sqrt(2 pi)) + log(1 - 1/x^2 + 3/x^4 - ...), whose terms
    are (2k-1)!!/x^2k: 12 of them leave 23!!/30^24, under 1e-19 relative."""
    if x > -_LOG_PHI_SERIES:
        return math.log(_phi(x))
    series, term, inverse = 1.0, 1.0, 1.0 / (x * x)
    for k in range(1, 13):
        term *= -(2 * k - 1) * inverse
        series += term
    return -0.5 * x * x - math.log(-x * math.sqrt(2.0 * math.pi)) + math.log(series)


def _gaussian_delta(mu: float, eps: float) -> float:
    """delta(eps) of the Gaussian mechanism of sensitivity mu (in noise units), Balle & Wang 2018:
    Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu). From eps = `_EXP_LIMIT` (reached from mu = 37
    at delta = 1e-5) e^eps would overflow a double: the second term is then exp(eps + log Phi(..)),
    whose exponent is at most -(mu/2 - eps/mu)^2 / 2 <= 0."""
    if eps < _EXP_LIMIT:
        return _phi(mu / 2 - eps / mu) - math.exp(eps) * _phi(-mu / 2 - eps / mu)
    return _phi(mu / 2 - eps / mu) - math.exp(eps + _log_phi(-mu / 2 - eps / mu))


def gaussian_epsilon(mu, delta: float):
    """The smallest epsilon with the Gaussian mechanism of sensitivity/noise ratio `mu` (array or
    number) (epsilon, delta)-DP: Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) = delta, solved by
    bisection to machine precision; exact for a Gaussian. mu = 0 gives 0; NaN stays NaN."""
    delta = check_delta(delta)
    mus = np.asarray(mu, dtype=np.float64)
    out = np.full(mus.shape, np.nan)
    for index, m in np.ndenumerate(mus):
        if math.isnan(m):
            continue
        if m < 0:
            raise ValueError(f"mu must be >= 0, got {m}")
        if m == 0 or _gaussian_delta(m, 0.0) <= delta:
            out[index] = 0.0
            continue
        lo, hi = 0.0, float(dp_epsilon(m * m / 2, delta))  # the RDP conversion is an upper bound
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            lo, hi = (mid, hi) if _gaussian_delta(m, mid) > delta else (lo, mid)
        out[index] = hi
    return out if out.ndim else float(out)
