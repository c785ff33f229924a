"""The plan of PowerGossip's static half-step: every view it works on and the argument lists of its
compiled tensor work (`kernels`), taken once from the parts of `powergossip_state`.

Work is done once per half-step, not once per neighbour: tensors of the same matrix shape are
stacked and multiplied with `bmm`; the products for all neighbours come from one multiplication of M
by the neighbours' factors side by side, and the updates from all neighbours are added by one
`baddbmm` of rank deg*r. Per-edge work (orthonormalising the shared factor, forming it from the two
products) runs on tensors whose shape is the same at both ends, so both ends compute identical bits.
At rank 1 the factors of all groups sit in (deg, width) rows laid out like the messages they are
formed from, so that forming every group's new factor is one subtraction per run of neighbours on
the same side, and scaling them one multiplication. (The products, computed from these strided
factors, round differently from products of contiguous ones; both ends still form the same factor,
since each subtracts the same two products.) A static half-step's tensor work is two functions
compiled by TorchScript (`kernels`), one before the exchange and one after, so that it runs without
the GIL: two peers of the in-process cluster can then compute at once (`LocalCluster(lanes=2)`).

So a static half-step is two compiled calls around the exchange, however many groups and
neighbours there are: `multiply_into_messages` (orthonormalise the factors at rank 1, multiply M
by every neighbour's factor, write the products and the exact part into the messages) and
`form_factors_and_update` (form each edge's new factor from the two products, scale it and add
the update, mix the exact part). The views depend on the groups' buffers: a plan is taken again
whenever the parameters are re-stacked (`StackedParams.restack`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import torch

from ..comm.base import Tensor
from .kernels import Normalization, Products, Update
from .lowrank import GRAM_SCHMIDT_MAX_RANK
from .powergossip_state import (
    EdgeFactors,
    MatrixGroup,
    MessageBuffers,
    StackedParams,
    segments_of,
)


@dataclasses.dataclass
class SidePlan:
    """The views one group works on in a static half-step of one side (right: multiply by Q)."""

    group: MatrixGroup
    blocks: List[Tensor]  # each neighbour's factor to multiply by, (batch, r, n)
    factor_sets: Optional[Tensor]  # all of them as (batch, deg, r, n), for one Gram-Schmidt call
    matrix: Tensor  # M^T (right) or M (left), as bmm takes it
    factors: Tensor  # (batch, deg*r, n): the factors multiplied by, side by side
    products: Tensor  # (batch, deg*r, length): their products with M
    product_sets: Tensor  # the same as (batch, deg, r, length)
    send_sets: Tensor  # every neighbour's message segment, as (batch, deg, r, length)
    differences: List[tuple]  # (first, second, out) per run of neighbours: out = first - second
    scaled_left_t: Tensor  # the group's scaled P^T, transposed for the update
    norms: Optional[Tensor] = None  # rank 1: (batch, deg, 1), where the factors' norms are written


@dataclasses.dataclass
class HalfStepWork:
    """The argument lists of a static half-step's compiled tensor work (see `kernels`)."""

    multiply: Products  # for multiply_into_messages, after the normalisation: products, messages
    update: Update  # for form_factors_and_update: new factors, scaled P, updates, exact mixing


def sign_runs(me: int, neighbors: Sequence[int]) -> List[tuple]:
    """Runs (start, stop, smaller) of consecutive neighbour positions on the same side of this
    peer's rank `me`: within a run, the new factors are one subtraction in the same order."""
    runs: List[tuple] = []
    for n, j in enumerate(neighbors):
        smaller = me < j
        if runs and runs[-1][2] == smaller:
            runs[-1] = (runs[-1][0], n + 1, smaller)
        else:
            runs.append((n, n + 1, smaller))
    return runs


class StaticPlan:
    """`sides[side]`: a `SidePlan` per group; `work[(side, with the exact part)]`: the
    `HalfStepWork`; `normalization[side]`: the rank-1 orthonormalisation's arguments (absent at
    other ranks, which take `no_normalization`)."""

    def __init__(
        self,
        stacks: StackedParams,
        messages: MessageBuffers,
        edges: EdgeFactors,
        batch_neighbors: bool,
    ):
        self.stacks, self.messages, self.edges = stacks, messages, edges
        self.neighbors = edges.neighbors
        self.runs = sign_runs(edges.me, self.neighbors)
        self.sides: Dict[str, List[SidePlan]] = {
            side: [self._side_plan(index, g, side) for index, g in enumerate(stacks.groups)]
            for side in ("right", "left")
        }
        self.no_normalization = Normalization([], [], [], torch.zeros(()))
        self.normalization: Dict[str, Normalization] = {}
        self.work: Dict[tuple, HalfStepWork] = {}
        for side, plans in self.sides.items():
            if edges.factor_rows is not None:
                self.normalization[side] = Normalization(
                    factors=[plan.factors for plan in plans],
                    norms=[plan.norms for plan in plans],
                    norm_rows=[edges.norm_rows[side]],
                    epsilon=edges.epsilon,
                )
            weights = [float(w) for w in edges.weights]
            self._add_work(side, plans, weights, edges.gamma, batch_neighbors)

    def _differences(self, sends: Tensor, recvs: Tensor, new: Tensor, rows: bool) -> List[tuple]:
        """(first, second, out) per run of neighbours: big's product minus small's, written in the
        same order at both ends; `rows`: neighbours along dim 0 (else dim 1)."""
        out = []
        for start, stop, smaller in self.runs:
            first, second = (recvs, sends) if smaller else (sends, recvs)
            if rows:
                out.append((first[start:stop], second[start:stop], new[start:stop]))
            else:
                out.append((first[:, start:stop], second[:, start:stop], new[:, start:stop]))
        return out

    def _side_plan(self, index: int, g: MatrixGroup, side: str) -> SidePlan:
        deg, b, r = len(self.neighbors), g.batch, g.rank
        rows_of = self.edges.factor_rows
        right = side == "right"
        factors, new_factors = (g.right, g.left) if right else (g.left, g.right)
        products = g.products_right if right else g.products_left
        length = g.rows if right else g.cols  # of the products and of the new factors
        offset = self.messages.segments[(index, side)][0]
        # every neighbour's message segment, as (b, deg, r, length)
        sends = segments_of(self.messages.send_rows, offset, b, r, length)
        recvs = segments_of(self.messages.recv_rows, offset, b, r, length)
        norms, differences = None, []
        if rows_of is None:
            new_sets = new_factors.view(b, deg, r, length)
            differences = self._differences(sends, recvs, new_sets, rows=False)
        else:  # `_row_differences` forms every group's new factors at once
            start = sum(q.batch for q in self.stacks.groups[:index]) * deg
            norms = self.edges.norm_rows[side][start : start + b * deg].view(b, deg, 1)
        width = factors.shape[-1]
        return SidePlan(
            group=g,
            blocks=[g.block(factors, n) for n in range(deg)],
            factor_sets=factors.view(b, deg, r, width) if r <= GRAM_SCHMIDT_MAX_RANK else None,
            matrix=g.matrices.transpose(1, 2) if right else g.matrices,
            factors=factors,
            products=products,
            product_sets=products.view(b, deg, r, length),
            send_sets=sends,
            differences=differences,
            scaled_left_t=g.scaled_left.transpose(1, 2),
            norms=norms,
        )

    def _row_differences(self, side: str) -> List[tuple]:
        """At rank 1, every group's new factors at once: one subtraction per run of neighbours
        over the groups' part of the messages (big's product minus small's, as per group)."""
        new_rows = self.edges.factor_rows["left" if side == "right" else "right"]
        size = self.messages.numel[(side, False)]
        sends = self.messages.send_rows[:, :size]
        recvs = self.messages.recv_rows[:, :size]
        return self._differences(sends, recvs, new_rows[:, :size], rows=True)

    def _products(self, side: str, plans: List[SidePlan], batch_neighbors: bool) -> tuple:
        """The multiplications of one side, and what is copied into the messages after them."""
        lefts, rights, products, copy_to, copy_from = [], [], [], [], []
        for index, plan in enumerate(plans):
            if batch_neighbors:
                lefts.append(plan.factors)
                rights.append(plan.matrix)
                products.append(plan.products)
                copy_to.append(plan.send_sets)
                copy_from.append(plan.product_sets)
            else:  # one product per neighbour, straight into its message
                sends = self.messages.send_views[(index, side)]
                for block, j in zip(plan.blocks, self.neighbors):
                    lefts.append(block)
                    rights.append(plan.matrix)
                    products.append(sends[j])
        return lefts, rights, products, copy_to, copy_from

    def _low_rank_update(self, side: str, plans: List[SidePlan], batch_neighbors: bool) -> dict:
        """The new factors, their scaling and the updates of one side (`form_factors_and_update`
        without the exact part)."""
        rows_of = self.edges.factor_rows
        if rows_of is not None:  # rank 1: all groups at once
            differences = self._row_differences(side)
            factors, scales = [rows_of["left"]], [self.edges.scale_column]
            scaled = [rows_of["scaled_left"]]
        else:
            differences = [d for plan in plans for d in plan.differences]
            factors = [plan.group.left for plan in plans]
            scales = [plan.group.scales for plan in plans]
            scaled = [plan.group.scaled_left for plan in plans]
        matrices, update_lefts, update_rights = [], [], []
        for plan in plans:
            g = plan.group
            if batch_neighbors:  # all neighbours in one multiply-add
                matrices.append(g.matrices)
                update_lefts.append(plan.scaled_left_t)
                update_rights.append(g.right)
            else:
                for n in range(len(self.neighbors)):
                    matrices.append(g.matrices)
                    update_lefts.append(g.block(g.scaled_left, n).transpose(1, 2))
                    update_rights.append(g.block(g.right, n))
        return dict(
            firsts=[d[0] for d in differences],
            seconds=[d[1] for d in differences],
            differences=[d[2] for d in differences],
            factors=factors,
            scales=scales,
            scaled=scaled,
            matrices=matrices,
            lefts=update_lefts,
            rights=update_rights,
        )

    def _add_work(
        self,
        side: str,
        plans: List[SidePlan],
        weights: List[float],
        gamma: float,
        batch_neighbors: bool,
    ) -> None:
        """`work[(side, False)]` and `work[(side, True)]` (with the exact part)."""
        lefts, rights, products, copy_to, copy_from = self._products(side, plans, batch_neighbors)
        low_rank = self._low_rank_update(side, plans, batch_neighbors)
        messages, exact, neighbors = self.messages, self.stacks.exact, self.neighbors
        for has_exact in (False, True):
            to, source = list(copy_to), list(copy_from)
            mixing = dict(exact=None, received=[], weights=[], gamma=0.0, scratch=None)
            if has_exact and exact is not None:
                offset, size = messages.segments[("exact", side)]
                to.append(messages.send_rows[:, offset : offset + size])
                source.append(exact.expand(len(neighbors), size))
                mixing = dict(
                    exact=exact,
                    received=[messages.recv_views[("exact", side)][j] for j in neighbors],
                    weights=weights,
                    gamma=float(gamma),
                    scratch=self.stacks.exact_scratch,
                )
            multiply = Products(
                lefts=lefts,
                rights=rights,
                products=products,
                copy_to=to,
                copy_from=source,
                outgoing=messages.outgoing[(side, has_exact)],
            )
            self.work[(side, has_exact)] = HalfStepWork(multiply, Update(**low_rank, **mixing))


__all__ = ["StaticPlan", "SidePlan", "HalfStepWork", "sign_runs"]
