"""Mixing-weight schemes: turn an undirected graph into a symmetric, doubly stochastic W.

Every scheme takes a boolean adjacency matrix (symmetric, zero diagonal, nodes 0..n-1) and returns
a float64 n×n matrix whose off-diagonal support is exactly the edge set and whose diagonal is
"whatever is left", 1 − (sum of the row's edge weights), so rows sum to one by construction.

Schemes (see Xiao & Boyd, "Fast linear iterations for distributed averaging", 2004):

- ``"metropolis"``   W[i,j] = 1 / (1 + max(deg i, deg j)). Works on any graph; the default.
- ``"max_degree"``   W[i,j] = 1 / (1 + max degree). Works on any graph; slow on irregular ones.
- ``"uniform"``      W[i,j] = 1 / (1 + deg i). Symmetric only on regular graphs, so it is rejected
                     elsewhere rather than silently producing a W that drifts the average.
- ``"best_constant"`` W = I − αL with α = 2 / (λ₂(L) + λ_max(L)), the constant edge weight that
                     minimises the spectral radius of W − 11ᵀ/n. Its diagonal may be negative on
                     irregular graphs (e.g. the centre of a star); every eigenvalue still lies in
                     (−1, 1], which is what averaging needs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SCHEMES", "weight_matrix", "check_scheme"]

#: The weight schemes that can be computed from the graph structure alone.
SCHEMES: tuple[str, ...] = ("metropolis", "max_degree", "uniform", "best_constant")


def check_scheme(scheme: str, extra: tuple[str, ...] = ()) -> str:
    """Return ``scheme`` if it names a known weight scheme, else raise ``ValueError`` listing them.

    ``extra`` adds spellings that only some callers support (``"given"`` for weighted inputs).
    """
    valid = SCHEMES + tuple(extra)
    if not isinstance(scheme, str) or scheme not in valid:
        raise ValueError(f"unknown weights scheme {scheme!r}; valid: {', '.join(valid)}")
    return scheme


def _fill_diagonal(off: np.ndarray) -> np.ndarray:
    """Put 1 − (row sum of the off-diagonal part) on the diagonal of ``off`` (in place)."""
    np.fill_diagonal(off, 0.0)
    np.fill_diagonal(off, 1.0 - off.sum(axis=1))
    return off


def weight_matrix(adjacency: np.ndarray, scheme: str = "metropolis") -> np.ndarray:
    """Mixing matrix of the graph with boolean ``adjacency`` under weight ``scheme``.

    ``adjacency`` must be square, symmetric and have a zero diagonal (self-loops carry no weight
    here; the diagonal of W is derived). The graph is assumed connected; callers check that first
    so that a disconnected graph is reported as such rather than as a weighting failure.
    Returns a new float64 array.
    """
    check_scheme(scheme)
    a = np.asarray(adjacency, dtype=bool)
    n = a.shape[0]
    deg = a.sum(axis=1).astype(np.float64)

    if scheme == "metropolis":
        # Elementwise max of the two degrees is symmetric by construction, so W is exactly symmetric.
        w = np.where(a, 1.0 / (1.0 + np.maximum(deg[:, None], deg[None, :])), 0.0)
        return _fill_diagonal(w)

    if scheme == "max_degree":
        dmax = deg.max() if n else 0.0
        return _fill_diagonal(np.where(a, 1.0 / (1.0 + dmax), 0.0))

    if scheme == "uniform":
        if n and deg.min() != deg.max():
            raise ValueError(
                f"weights='uniform' (1/(deg+1)) is only doubly stochastic on regular graphs, "
                f"but degrees range from {int(deg.min())} to {int(deg.max())}; "
                f"use weights='metropolis'"
            )
        return _fill_diagonal(np.where(a, 1.0 / (1.0 + deg[:, None]), 0.0))

    # best_constant
    if n == 1:
        return np.ones((1, 1))
    lap = np.diag(deg) - a.astype(np.float64)
    eig = np.linalg.eigvalsh(lap)  # ascending; eig[0] == 0 for the connected graph
    alpha = 2.0 / (eig[1] + eig[-1])
    # Build the off-diagonal part directly (exact α on every edge) and derive the diagonal, rather
    # than I − αL, so the row sums are 1 to the last bit the same way as for the other schemes.
    return _fill_diagonal(np.where(a, alpha, 0.0))
