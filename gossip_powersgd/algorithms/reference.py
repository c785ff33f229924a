"""PowerGossip written plainly: the whole network in one function, edge by edge, tensor by tensor.

This is the algorithm of `powergossip.PowerGossip` without any of its speed: no stacking, no
batching over neighbours, no compiled kernels, no shared message buffers. The fast variants
(static or scheduled, batched or per neighbour, the rank-1 row layout) are tested against it
(tests/algorithms/test_reference.py). For each edge {i, j} of the topology (of the union graph, on a schedule)
and each compressed tensor, viewed as the matrix M (rows = shape[0], cols = the rest), the state is
the pair of factors P (rows x r), Q (cols x r), the same at both ends, and the edge's half-step
count s. At step t, for each of the `num_iterations` half-steps, every edge of W(t) takes one:

    s odd (right):  Q <- orthonormalise(Q);  P <- M_big Q - M_small Q      ( = D Q )
    s even (left):  P <- orthonormalise(P);  Q <- M_big^T P - M_small^T P  ( = D^T P )
    then            M_small += gamma W(t)[i, j] P Q^T,   M_big -= gamma W(t)[i, j] P Q^T

with D = M_big - M_small, every product taken from the models as they were when the half-step
began. The tensors not worth compressing (`lowrank.compressible_matrices`) are gossiped exactly in
the first half-step of each step: x_i += gamma sum_j W(t)[i, j] (x_j - x_i). The factors start from
each edge's generator (seed `edge_seed(seed, i, j)`): Q^T drawn for each group of equal-shape
matrices in turn, as one (batch, r, cols) tensor, each matrix taking its slice; with
`warm_start=False` the factor about to be orthonormalised is redrawn the same way at every
half-step. Edges idle at step t keep their factors and count.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..comm.base import Tensor
from .lowrank import compressible_matrices, orthonormalize_
from .powergossip import edge_seed

if TYPE_CHECKING:
    from topologies import AnyTopology


@dataclasses.dataclass
class Edge:
    """One edge's shared state: per compressed tensor k, P[k] (rows x r) and Q[k] (cols x r)."""

    generator: torch.Generator
    P: Dict[int, Tensor]
    Q: Dict[int, Tensor]
    half_steps: int = 0


def _draw(edge: Edge, groups, side: str, dtype) -> Dict[int, Tensor]:
    """A fresh factor for every compressed tensor, drawn group by group (vector-major, as stored)."""
    out = {}
    for (rows, cols), (indices, r) in groups.items():
        block = torch.randn(
            (len(indices), r, cols if side == "Q" else rows), generator=edge.generator, dtype=dtype
        )
        out.update({k: block[slot].T.clone() for slot, k in enumerate(indices)})
    return out


def _orthonormalise(factor: Tensor) -> Tensor:
    """The columns of `factor` made orthonormal (Gram-Schmidt with (norm + eps), QR above rank 4:
    `lowrank.orthonormalize_`, which takes the vectors as rows)."""
    vectors = factor.T.contiguous().unsqueeze(0)
    return orthonormalize_(vectors)[0].T


def _start_edges(
    topology: AnyTopology, n: int, seed: int, groups, matrix_shape, dtype
) -> Dict[Tuple[int, int], Edge]:
    """Every edge {i, j}, i < j, of the union graph: its generator seeded with `edge_seed(seed, i,
    j)`, Q drawn from it, P zero."""
    edges: Dict[Tuple[int, int], Edge] = {}
    for i in range(n):
        for j in topology.union.neighbors(i):
            if i < j:
                edge = Edge(torch.Generator().manual_seed(edge_seed(seed, i, j)), {}, {})
                edge.Q = _draw(edge, groups, "Q", dtype)
                edge.P = {
                    k: torch.zeros(matrix_shape[k][0], q.shape[1], dtype=dtype)
                    for k, q in edge.Q.items()
                }
                edges[(i, j)] = edge
    return edges


def _gossip_exact(models, exact: List[int], before, graph, gamma: float) -> None:
    """Exact gossip of the uncompressed tensors `exact`, from their values `before` the half-step:
    x_i += gamma sum_j W(t)[i, j] (x_j - x_i)."""
    for i in range(len(models)):
        for slot, k in enumerate(exact):
            mixed = sum(
                (
                    graph.weight(i, j) * (before[j][slot] - before[i][slot])
                    for j in graph.neighbors(i)
                ),
                torch.zeros_like(before[i][slot]),
            )
            models[i][k].add_(gamma * mixed)


def reference_powergossip(
    models: Sequence[List[Tensor]],
    topology: AnyTopology,
    steps: int,
    rank: int = 1,
    num_iterations: int = 1,
    gamma: Optional[float] = None,
    warm_start: bool = True,
    seed: int = 0,
    min_compression_rate: float = 1.0,
    on_half_step: Optional[Callable] = None,
) -> Dict[Tuple[int, int], Edge]:
    """Run `steps` PowerGossip steps on every peer's tensors (`models[i]`, updated in place) on a
    `Topology` or a schedule. gamma=None is the topology's `gamma`, 1 on a schedule.
    `on_half_step(edge_key, k, factor, m_small, m_big)`, if given, is called with each factor before
    it is orthonormalised. Returns the edges' state."""
    n, dtype = len(models), models[0][0].dtype
    static = topology.union is topology
    gamma = (float(topology.gamma) if static else 1.0) if gamma is None else float(gamma)
    shapes = compressible_matrices(models[0], rank, min_compression_rate)
    groups = {shape: (indices, min(rank, *shape)) for shape, indices in shapes.items()}
    matrix_shape = {k: shape for shape, indices in shapes.items() for k in indices}
    exact = [k for k in range(len(models[0])) if k not in matrix_shape]
    edges = _start_edges(topology, n, seed, groups, matrix_shape, dtype)
    matrix = lambda i, k: models[i][k].view(matrix_shape[k])  # noqa: E731 (a view: updated in place)
    for t in range(steps):
        graph = topology.at(t)
        active = [(i, j) for (i, j) in edges if j in graph.neighbors(i)]
        for iteration in range(num_iterations):
            updates = {}  # (peer, k) -> the sum of its edges' corrections, added after all edges
            for small, big in active:
                edge = edges[(small, big)]
                edge.half_steps += 1
                right = edge.half_steps % 2 == 1
                if not warm_start:
                    drawn = _draw(edge, groups, "Q" if right else "P", dtype)
                    (edge.Q if right else edge.P).update(drawn)
                for k in matrix_shape:
                    m_small, m_big = matrix(small, k), matrix(big, k)
                    if on_half_step is not None:
                        on_half_step(
                            (small, big), k, edge.Q[k] if right else edge.P[k], m_small, m_big
                        )
                    if right:
                        edge.Q[k] = _orthonormalise(edge.Q[k])
                        edge.P[k] = m_big @ edge.Q[k] - m_small @ edge.Q[k]
                    else:
                        edge.P[k] = _orthonormalise(edge.P[k])
                        edge.Q[k] = m_big.T @ edge.P[k] - m_small.T @ edge.P[k]
                    correction = gamma * graph.weight(small, big) * (edge.P[k] @ edge.Q[k].T)
                    for peer, sign in ((small, 1.0), (big, -1.0)):
                        updates[(peer, k)] = updates.get((peer, k), 0) + sign * correction
            before = (
                [[models[i][k].clone() for k in exact] for i in range(n)]
                if iteration == 0
                else None
            )
            for (peer, k), update in updates.items():
                matrix(peer, k).add_(update)
            if before is not None:
                _gossip_exact(models, exact, before, graph, gamma)
    return edges


__all__ = ["Edge", "reference_powergossip"]
