"""PowerGossip on a schedule (a graph per step): per-edge half-step counters and the half-step
of the edges active at a step.

Split from `powergossip` by job: `PowerGossipSchedule` is the scheduled half of the `PowerGossip`
class (a mixin on the state `PowerGossip.__init__` and `PowerGossipBuffers` set up); behaviour
and names are unchanged.
"""

from __future__ import annotations

from typing import List

import torch

from ..comm.base import Tensor
from .base import step_weights
from .exact import mix_exact
from .lowrank import orthonormalize_
from .powergossip_buffers import _EdgeFactors


class PowerGossipSchedule:
    """The scheduled-step methods of `PowerGossip` (see the `powergossip` module docstring)."""

    def _edge_side(self, j: int, ahead: int = 1) -> str:
        """The side of edge j's half-step `ahead` half-steps from now (odd counts are right)."""
        return "right" if (self._edge_half_steps[j] + ahead) % 2 == 1 else "left"

    def _scheduled_step(self) -> None:
        step = self.steps
        active, weights = step_weights(self.comm, step)
        self.half_steps += self.num_iterations
        if not active:
            return
        self._check_homes()
        positions = [self.comm.neighbors.index(j) for j in active]
        for iteration in range(self.num_iterations):
            for j in active:
                self._edge_half_steps[j] += 1
            self._scheduled_half_step(step, active, positions, weights, with_exact=iteration == 0)

    def _rows(self, g: _EdgeFactors, positions: List[int]) -> Tensor:
        """Indices of the factor vectors of the union neighbours at `positions`, block by block."""
        r = g.rank
        return torch.tensor([n * r + k for n in positions for k in range(r)], device=self.device)

    def _scheduled_half_step(
        self, step: int, active, positions: List[int], weights: List[float], with_exact: bool
    ) -> None:
        sides = {j: self._edge_side(j, ahead=0) for j in active}
        by_side = {
            side: [(n, j) for n, j in zip(positions, active) if sides[j] == side]
            for side in ("right", "left")
        }
        has_exact = with_exact and self._exact is not None

        # 1. Per side, orthonormalise the active edges' factors and multiply M by them together.
        for index, g in enumerate(self._groups):
            for side, edges in by_side.items():
                if not edges:
                    continue
                right = side == "right"
                factors = g.right if right else g.left
                for n, j in edges:
                    block = g.block(factors, n)
                    if not self.warm_start:
                        block.copy_(self._draw(j, block.shape))
                    orthonormalize_(block)
                sends = self._send_views[(index, side)]
                matrix = g.matrices.transpose(1, 2) if right else g.matrices
                if self.batch_neighbors:
                    stacked = factors.index_select(1, self._rows(g, [n for n, _ in edges]))
                    products = torch.bmm(stacked, matrix)
                    for k, (_, j) in enumerate(edges):
                        sends[j].copy_(products[:, k * g.rank : (k + 1) * g.rank, :])
                else:
                    for n, j in edges:
                        torch.bmm(g.block(factors, n), matrix, out=sends[j])
        if has_exact:
            x = self._exact
            for j in active:
                self._send_views[("exact", sides[j])][j].copy_(x)

        # 2. One message per active neighbour, sized for that edge's side.
        numel = {j: self._message_numel[(sides[j], has_exact)] for j in active}
        self._exchange(
            {j: self._send[j][: numel[j]] for j in active},
            {j: self._recv[j][: numel[j]] for j in active},
            step,
        )

        # 3. Both ends form the edge's new factor, then M += sum_j sigma_j gamma W(t)_ij P_j Q_j^T.
        scales = {j: self._signs[n] * self.gamma * w for n, j, w in zip(positions, active, weights)}
        for index, g in enumerate(self._groups):
            for side, edges in by_side.items():
                sends, recvs = self._send_views[(index, side)], self._recv_views[(index, side)]
                new_factors = g.left if side == "right" else g.right
                for n, j in edges:
                    if self.comm.rank < j:
                        torch.sub(recvs[j], sends[j], out=g.block(new_factors, n))
                    else:
                        torch.sub(sends[j], recvs[j], out=g.block(new_factors, n))
            if self.batch_neighbors:
                rows = self._rows(g, positions)
                column = torch.tensor(
                    [scales[j] for j in active for _ in range(g.rank)],
                    dtype=self.dtype,
                    device=self.device,
                ).view(1, -1, 1)
                scaled = g.left.index_select(1, rows).mul_(column)
                g.matrices.baddbmm_(scaled.transpose(1, 2), g.right.index_select(1, rows))
            else:
                for n, j in zip(positions, active):
                    scaled = g.block(g.left, n) * scales[j]
                    g.matrices.baddbmm_(scaled.transpose(1, 2), g.block(g.right, n))
        if has_exact:
            received = [self._recv_views[("exact", sides[j])][j] for j in active]
            mix_exact(self._exact, received, weights, self.gamma, self._exact_scratch)
