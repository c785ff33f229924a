"""PowerGossip's memory: how one peer lays out its stacked parameters, the factors it shares with
each neighbour, its message buffers and the argument lists of the compiled half-step work.

Split from `powergossip` by job: `PowerGossipBuffers` is the set-up half of the `PowerGossip`
class (a mixin; it reads the attributes `PowerGossip.__init__` sets before calling it), and the
dataclasses here are what the step works on. Behaviour and names are unchanged; `powergossip`
re-exports `edge_seed`.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np
import torch

from ..comm.base import Tensor
from .kernels import Normalization, Products, Update
from .lowrank import GRAM_SCHMIDT_MAX_RANK, ORTHO_EPS, MatrixStack, matrix_stacks


def edge_seed(seed: int, i: int, j: int) -> int:
    """A seed both ends of edge {i, j} derive alike, without collisions between edges (unlike joined
    decimal strings, where (1, 12) and (11, 2) collide)."""
    small, big = min(i, j), max(i, j)
    state = np.random.SeedSequence([seed, small, big]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & 0x7FFF_FFFF_FFFF_FFFF


#: Alignment of each neighbour's message buffer (that of PyTorch's CPU allocator).
_ALIGN_BYTES = 64


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _segments_of(rows: Tensor, offset: int, batch: int, *inner: int) -> Tensor:
    """The (batch, deg, *inner) view of every row's segment that starts at `offset` of a
    (deg, width) tensor: neighbour n's (batch, *inner) block is row n's segment."""
    size = batch * int(np.prod(inner))
    return rows[:, offset : offset + size].view(rows.shape[0], batch, *inner).transpose(0, 1)


@dataclasses.dataclass
class _EdgeFactors(MatrixStack):
    """One matrix shape's parameters, stacked, with the factors shared with every neighbour.

    The factors of all neighbours sit side by side, vector-major: neighbour number n owns rows
    n*r:(n+1)*r of `right` (its Q^T, batch x r x cols) and of `left` (its P^T, batch x r x rows).
    """

    matrices: Optional[Tensor] = None  # (batch, rows, cols): the parameters themselves (views)
    right: Optional[Tensor] = None  # (batch, deg*r, cols): every neighbour's Q^T
    left: Optional[Tensor] = None  # (batch, deg*r, rows): every neighbour's P^T
    scaled_left: Optional[Tensor] = (
        None  # (batch, deg*r, rows): P^T times sigma*gamma*W per neighbour
    )
    products_right: Optional[Tensor] = None  # (batch, deg*r, rows) = (M Q)^T for every neighbour
    products_left: Optional[Tensor] = None  # (batch, deg*r, cols) = (M^T P)^T for every neighbour
    scales: Optional[Tensor] = None  # (1, deg*r, 1): sigma * gamma * W[i, j] for each factor vector


@dataclasses.dataclass
class _SidePlan:
    """The views one group works on in a static half-step of one side (right: multiply by Q)."""

    group: _EdgeFactors
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
class _HalfStepWork:
    """The argument lists of a static half-step's compiled tensor work (see `kernels`): a
    half-step is two calls around the exchange, however many groups and neighbours there are."""

    multiply: Products  # for multiply_into_messages, after the normalisation: products, messages
    update: Update  # for form_factors_and_update: new factors, scaled P, updates, exact mixing


class PowerGossipBuffers:
    """The set-up methods of `PowerGossip` (groups, homes, factors, messages, plans, work)."""

    def _make_groups(self) -> List[_EdgeFactors]:
        groups = matrix_stacks(_EdgeFactors, self.params, self.rank, self.min_compression_rate)
        self._compressed = {k for g in groups for k in g.indices}
        for group in groups:
            self._home(group)
        return groups

    def _home(self, group: _EdgeFactors) -> None:
        """Give a group one (batch, rows, cols) buffer that its parameters are views of."""
        first = self.params[group.indices[0]]
        if group.batch == 1 and first.is_contiguous():
            group.matrices = first.data.view(1, group.rows, group.cols)
            return
        if group.matrices is None:
            group.matrices = torch.empty(
                (group.batch, group.rows, group.cols), dtype=self.dtype, device=self.device
            )
        for slot, k in enumerate(group.indices):
            tensor = self.params[k]
            group.matrices[slot].copy_(tensor.detach().reshape(group.rows, group.cols))
            tensor.data = group.matrices[slot].view(tensor.shape)

    def _home_exact(self) -> None:
        """Give the exactly gossiped tensors one flat buffer that they are views of, so that a step
        mixes that buffer in place instead of packing and unpacking every small tensor."""
        if not self._exact_indices:
            return
        if self._exact is None:
            total = sum(self.params[k].numel() for k in self._exact_indices)
            self._exact = torch.empty(total, dtype=self.dtype, device=self.device)
            offset = 0
            for k in self._exact_indices:
                size = self.params[k].numel()
                self._exact_views.append(self._exact[offset : offset + size])
                offset += size
        for k, flat in zip(self._exact_indices, self._exact_views):
            tensor = self.params[k]
            flat.copy_(tensor.detach().reshape(-1))
            tensor.data = flat.view(tensor.shape)

    def _check_homes(self) -> None:
        """Re-stack whatever has been re-pointed since the last step (e.g. by `model.to`)."""
        params = self.params
        # one comparison of two lists: this runs at every step
        if [params[k].data_ptr() for k in self._home_indices] == self._home_ptrs:
            return
        for group in self._groups:
            for slot, k in enumerate(group.indices):
                if params[k].data_ptr() != group.matrices[slot].data_ptr():
                    self._home(group)
                    break
        for k, flat in zip(self._exact_indices, self._exact_views):
            if params[k].data_ptr() != flat.data_ptr() or params[k].numel() != flat.numel():
                self._home_exact()
                break
        self._make_plans()

    def _draw(self, j: int, shape) -> Tensor:
        # Drawn on the CPU from the edge's generator, then moved: a CPU peer and a GPU peer agree.
        return torch.randn(shape, generator=self._generators[j], dtype=self.dtype).to(self.device)

    def _make_factors(self) -> None:
        neighbors = self.comm.neighbors
        deg = len(neighbors)
        # sigma * gamma * W[i, j] per factor vector, to scale all neighbours' P in one multiply
        weights = self._weights if self._weights is not None else [0.0] * deg
        scales = [self._signs[n] * self.gamma * weights[n] for n in range(deg)]
        new = lambda *shape: torch.zeros(shape, dtype=self.dtype, device=self.device)  # noqa: E731
        # At rank 1 the factors of all groups sit in (deg, width) rows laid out as the messages they
        # are formed from (a left factor like a right half-step's message, and the other way
        # round): forming every group's new factor is then one subtraction per run of neighbours,
        # and scaling them one multiplication, instead of a few operations per group.
        self._factor_rows: Optional[Dict[str, Tensor]] = None
        if self._groups and all(g.rank == 1 for g in self._groups):
            align = max(1, _ALIGN_BYTES // self._element_size())
            left = _round_up(self._message_numel[("right", False)], align)
            right = _round_up(self._message_numel[("left", False)], align)
            self._factor_rows = {
                "left": new(deg, left),
                "right": new(deg, right),
                "scaled_left": new(deg, left),
            }
            self._scale_column = torch.tensor(scales, dtype=self.dtype, device=self.device).view(
                deg, 1
            )
            # One norm per factor vector, for the vectors multiplied by on each side, so that the
            # epsilon is added to all of them at once; a tensor, not a Python number, because
            # a number would be converted into one at every call.
            vectors = deg * sum(g.batch for g in self._groups)
            self._norm_rows = {"right": new(vectors), "left": new(vectors)}
            self._epsilon = torch.tensor(ORTHO_EPS, dtype=self.dtype, device=self.device)
        for index, group in enumerate(self._groups):
            b, rows, cols, r = group.batch, group.rows, group.cols, group.rank
            if self._factor_rows is None:
                group.right = new(b, deg * r, cols)
                group.left = new(b, deg * r, rows)
                group.scaled_left = new(b, deg * r, rows)
            else:
                rows_of = self._factor_rows
                group.right = _segments_of(
                    rows_of["right"], self._segments[(index, "left")][0], b, cols
                )
                group.left = _segments_of(
                    rows_of["left"], self._segments[(index, "right")][0], b, rows
                )
                group.scaled_left = _segments_of(
                    rows_of["scaled_left"], self._segments[(index, "right")][0], b, rows
                )
            group.products_right = new(b, deg * r, rows)
            group.products_left = new(b, deg * r, cols)
            for n, j in enumerate(neighbors):
                group.block(group.right, n).copy_(self._draw(j, (b, r, cols)))
            group.scales = torch.tensor(
                [scales[n] for n in range(deg) for _ in range(r)],
                dtype=self.dtype,
                device=self.device,
            ).view(1, deg * r, 1)

    def _make_messages(self) -> None:
        """One preallocated send and receive buffer per neighbour, with views for every segment.

        Layout of a message: for each group, its products (batch x r x rows on a right half-step,
        (M Q)^T; batch x r x cols on a left one, (M^T P)^T), then, on the first half-step of a
        step, the exact part. The neighbours' buffers are the rows of one (deg, capacity) tensor,
        so that a segment of every neighbour's message is one strided view.
        """
        neighbors = self.comm.neighbors
        right = sum(g.batch * g.rows * g.rank for g in self._groups)
        left = sum(g.batch * g.cols * g.rank for g in self._groups)
        exact = self._exact.numel() if self._exact is not None else 0
        self._message_numel = {
            (side, with_exact): size + (exact if with_exact else 0)
            for side, size in (("right", right), ("left", left))
            for with_exact in (False, True)
        }
        # Rows start on 64-byte boundaries, as separately allocated buffers do: a BLAS kernel
        # writing a product into a message may round differently at another alignment.
        capacity = _round_up(max(right, left) + exact, max(1, _ALIGN_BYTES // self._element_size()))
        self._send_rows = torch.zeros(
            (len(neighbors), capacity), dtype=self.dtype, device=self.device
        )
        self._recv_rows = torch.zeros_like(self._send_rows)
        self._send = {j: self._send_rows[n] for n, j in enumerate(neighbors)}
        self._recv = {j: self._recv_rows[n] for n, j in enumerate(neighbors)}
        # Segment offsets: (group index or "exact", side) -> (offset, size).
        self._segments: Dict[tuple, tuple] = {}
        # Segment views: (group index, side) -> neighbour -> view; "exact" -> neighbour -> view.
        self._send_views: Dict[tuple, Dict[int, Tensor]] = {}
        self._recv_views: Dict[tuple, Dict[int, Tensor]] = {}
        for side in ("right", "left"):
            offset = 0
            for index, g in enumerate(self._groups):
                shape = (g.batch, g.rank, g.rows if side == "right" else g.cols)
                size = shape[0] * shape[1] * shape[2]
                self._segments[(index, side)] = (offset, size)
                for views, buffers in (
                    (self._send_views, self._send),
                    (self._recv_views, self._recv),
                ):
                    views[(index, side)] = {
                        j: buffers[j][offset : offset + size].view(shape) for j in neighbors
                    }
                offset += size
            self._segments[("exact", side)] = (offset, exact)
            for views, buffers in ((self._send_views, self._send), (self._recv_views, self._recv)):
                views[("exact", side)] = {j: buffers[j][offset : offset + exact] for j in neighbors}
        # The exchange's buffers, sliced to each message's size once: (side, with exact) -> dicts.
        self._messages = {
            key: (
                {j: self._send[j][:numel] for j in neighbors},
                {j: self._recv[j][:numel] for j in neighbors},
            )
            for key, numel in self._message_numel.items()
        }
        # All of those messages at once, for the finiteness check before they leave.
        self._outgoing = {
            key: self._send_rows[:, :numel] for key, numel in self._message_numel.items()
        }

    def _element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def _sign_runs(self) -> List[tuple]:
        """Runs (start, stop, smaller) of consecutive neighbour positions on the same side of this
        peer's rank: within a run, the new factors are one subtraction in the same order."""
        runs: List[tuple] = []
        for n, j in enumerate(self.comm.neighbors):
            smaller = self.comm.rank < j
            if runs and runs[-1][2] == smaller:
                runs[-1] = (runs[-1][0], n + 1, smaller)
            else:
                runs.append((n, n + 1, smaller))
        return runs

    def _make_plans(self) -> None:
        """Precompute, per group and side, the views a static half-step works on, so that a
        half-step issues a handful of operations per group whatever the degree (the views depend
        on the group's buffers: they are rebuilt whenever a group is re-stacked)."""
        deg = len(self.comm.neighbors)
        runs = self._sign_runs()
        # Where each parameter's data must start for the plans to be valid (see `_check_homes`).
        homes = [
            (k, group.matrices[slot])
            for group in self._groups
            for slot, k in enumerate(group.indices)
        ]
        homes += list(zip(self._exact_indices, self._exact_views))
        self._home_indices = [k for k, _ in homes]
        self._home_ptrs = [home.data_ptr() for _, home in homes]
        self._plans: Dict[str, List[_SidePlan]] = {"right": [], "left": []}
        for index, g in enumerate(self._groups):
            b, r = g.batch, g.rank
            for side in ("right", "left"):
                right = side == "right"
                factors, new_factors = (g.right, g.left) if right else (g.left, g.right)
                products = g.products_right if right else g.products_left
                length = g.rows if right else g.cols  # of the products and of the new factors
                offset = self._segments[(index, side)][0]
                # every neighbour's message segment, as (b, deg, r, length)
                sends = _segments_of(self._send_rows, offset, b, r, length)
                recvs = _segments_of(self._recv_rows, offset, b, r, length)
                new_sets = new_factors.view(b, deg, r, length)
                differences = []  # at rank 1, `_row_differences` does this for all groups at once
                for start, stop, smaller in runs if self._factor_rows is None else ():
                    # big's product minus small's product, written in the same order at both ends
                    first, second = (recvs, sends) if smaller else (sends, recvs)
                    differences.append(
                        (first[:, start:stop], second[:, start:stop], new_sets[:, start:stop])
                    )
                width = factors.shape[-1]
                norms = None
                if self._factor_rows is not None:
                    start = sum(q.batch for q in self._groups[:index]) * deg
                    norms = self._norm_rows[side][start : start + b * deg].view(b, deg, 1)
                self._plans[side].append(
                    _SidePlan(
                        group=g,
                        blocks=[g.block(factors, n) for n in range(deg)],
                        factor_sets=factors.view(b, deg, r, width)
                        if r <= GRAM_SCHMIDT_MAX_RANK
                        else None,
                        matrix=g.matrices.transpose(1, 2) if right else g.matrices,
                        factors=factors,
                        products=products,
                        product_sets=products.view(b, deg, r, length),
                        send_sets=sends,
                        differences=differences,
                        scaled_left_t=g.scaled_left.transpose(1, 2),
                        norms=norms,
                    )
                )
        # At rank 1, every group's new factors at once: one subtraction per run of neighbours over
        # the groups' part of the messages (big's product minus small's, as per group above).
        self._row_differences: Dict[str, List[tuple]] = {}
        if self._factor_rows is not None:
            for side, new_rows in (
                ("right", self._factor_rows["left"]),
                ("left", self._factor_rows["right"]),
            ):
                size = self._message_numel[(side, False)]
                sends, recvs = self._send_rows[:, :size], self._recv_rows[:, :size]
                differences = []
                for start, stop, smaller in runs:
                    first, second = (recvs, sends) if smaller else (sends, recvs)
                    differences.append(
                        (first[start:stop], second[start:stop], new_rows[start:stop, :size])
                    )
                self._row_differences[side] = differences
        self._make_work()

    def _make_work(self) -> None:
        """The argument lists of every static half-step's tensor work (`_HalfStepWork`), per side
        and with or without the exact part."""
        self._work: Dict[tuple, _HalfStepWork] = {}
        neighbors = self.comm.neighbors
        self._no_normalization = Normalization([], [], [], torch.zeros(()))
        if not self.comm.is_static or not neighbors:
            return
        weights = [float(w) for w in self._weights]
        self._normalization = {}
        for side, plans in self._plans.items():
            if self._factor_rows is not None:
                self._normalization[side] = Normalization(
                    factors=[plan.factors for plan in plans],
                    norms=[plan.norms for plan in plans],
                    norm_rows=[self._norm_rows[side]],
                    epsilon=self._epsilon,
                )
            lefts, rights, products, copy_to, copy_from = [], [], [], [], []
            for index, plan in enumerate(plans):
                if self.batch_neighbors:
                    lefts.append(plan.factors)
                    rights.append(plan.matrix)
                    products.append(plan.products)
                    copy_to.append(plan.send_sets)
                    copy_from.append(plan.product_sets)
                else:  # one product per neighbour, straight into its message
                    sends = self._send_views[(index, side)]
                    for block, j in zip(plan.blocks, neighbors):
                        lefts.append(block)
                        rights.append(plan.matrix)
                        products.append(sends[j])
            if self._factor_rows is not None:  # rank 1: all groups at once
                differences = self._row_differences[side]
                factors, scales = [self._factor_rows["left"]], [self._scale_column]
                scaled = [self._factor_rows["scaled_left"]]
            else:
                differences = [d for plan in plans for d in plan.differences]
                factors = [plan.group.left for plan in plans]
                scales = [plan.group.scales for plan in plans]
                scaled = [plan.group.scaled_left for plan in plans]
            matrices, update_lefts, update_rights = [], [], []
            for plan in plans:
                g = plan.group
                if self.batch_neighbors:  # all neighbours in one multiply-add
                    matrices.append(g.matrices)
                    update_lefts.append(plan.scaled_left_t)
                    update_rights.append(g.right)
                else:
                    for n in range(len(neighbors)):
                        matrices.append(g.matrices)
                        update_lefts.append(g.block(g.scaled_left, n).transpose(1, 2))
                        update_rights.append(g.block(g.right, n))
            low_rank = dict(
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
            for has_exact in (False, True):
                to, source = list(copy_to), list(copy_from)
                mixing = dict(exact=None, received=[], weights=[], gamma=0.0, scratch=None)
                if has_exact and self._exact is not None:
                    offset, size = self._segments[("exact", side)]
                    to.append(self._send_rows[:, offset : offset + size])
                    source.append(self._exact.expand(len(neighbors), size))
                    received = [self._recv_views[("exact", side)][j] for j in neighbors]
                    mixing = dict(
                        exact=self._exact,
                        received=received,
                        weights=weights,
                        gamma=float(self.gamma),
                        scratch=self._exact_scratch,
                    )
                multiply = Products(
                    lefts=lefts,
                    rights=rights,
                    products=products,
                    copy_to=to,
                    copy_from=source,
                    outgoing=self._outgoing[(side, has_exact)],
                )
                self._work[(side, has_exact)] = _HalfStepWork(
                    multiply, Update(**low_rank, **mixing)
                )
