"""PowerGossip: gossip of low-rank approximations of the model differences between neighbours.

Vogels, Karimireddy, Jaggi, "Practical Low-Rank Communication Compression in Decentralized Deep
Learning", NeurIPS 2020. For an edge {i, j} and a parameter viewed as a matrix M (rows x rest), both
ends hold the same factors P (rows x r) and Q (cols x r), seeded from (seed, min(i,j), max(i,j)).
With D = M_big - M_small (big = max(i, j)), half-steps alternate on a global counter:

    right (odd):  orthonormalise Q, send M Q,   both form P = M_big Q - M_small Q   = D Q
    left  (even): orthonormalise P, send M^T P, both form Q = M_big^T P - M_small^T P = D^T P

and after each half-step  M_i += sigma * gamma * W[i,j] * P Q^T,  sigma = +1 at the smaller rank and
-1 at the larger, so each edge adds +U at one end and -U at the other: the average over peers is
preserved exactly (up to float rounding). The factor kept from one half-step seeds the next (warm
start), so successive steps continue one power iteration on the slowly changing D. Nothing but the
products crosses the wire; no error feedback is needed since what is not sent stays in D.

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

Tensors with one dimension, and any tensor whose low-rank form would not be smaller (PyTorch's
`min_compression_rate` rule), are gossiped exactly, once per `step()`, in the first half-step's
message and with the same gamma.

On a schedule (a graph per step t, t being this algorithm's own step count) the state is kept per
edge of the union graph: each edge's factors, generator and its own half-step counter (which side
comes next). At step t only the edges of W(t) take part, with the weights W(t)[i, j]; an idle edge's
factors and counter stay as they are, so when the edge comes back its power iteration resumes from
its last factor, on the side it had reached. A union edge is seeded at construction exactly as a
static edge is. Both ends of an edge see the same history, so they agree on its counter and
factors, and each active edge still adds +U and -U at its ends: the average is preserved exactly.
The batched path gathers the active edges' factors and multiplies them together, per side.
The default gamma on a schedule is 1 (plain mixing with each step's W).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, List, Optional

import numpy as np
import torch

from ..comm.base import Tensor
from ..specs import FALSE_WORDS, check_seed, parse_bool, parse_optional_float, parse_seed
from .base import (
    GossipAlgorithm,
    Option,
    ParamsLike,
    load_tensors_,
    require_undirected,
    step_weights,
    warn_if_unstable_gamma,
)
from .exact import mix_exact, resolve_gamma
from .kernels import (
    Normalization,
    Products,
    Update,
    form_factors_and_update,
    multiply_into_messages,
)
from .layout import MessageLayout, Part, unflatten
from .lowrank import GRAM_SCHMIDT_MAX_RANK, ORTHO_EPS, MatrixStack, matrix_stacks, orthonormalize_

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology


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


class LowRankProducts(MessageLayout):
    """A PowerGossip message. On its edge's right half-step it holds, for each group of stacked
    matrices (the `groups` field: [indices, rows, cols, r] each, in order), the products
    (M Q)^T as batch x r x rows; on a left half-step (M^T P)^T as batch x r x cols; then, in the
    first half-step of a step only, the exactly gossiped tensors (`exact_indices`), flattened.

    The side is the edge's: on a static topology every edge takes the same one (an odd half-step
    count is right), on a schedule each edge keeps its own counter (an idle edge skips steps), so
    `annotate` asks the algorithm (`PowerGossip.edge_side`) and records, with the side, the shared
    factor the products were computed with (Q on a right half-step, P on a left one, as both ends
    hold it). How a peer keeps its factors (at rank 1, side by side in rows laid out like the
    messages) does not change what a message holds.
    """

    @classmethod
    def run_fields(cls, algorithm):
        return {
            "groups": algorithm.groups,
            "exact_indices": [
                k for k in range(len(algorithm.params)) if k not in algorithm.compressed_indices
            ],
        }

    def annotate(self, algorithm, sender):
        kind = algorithm.edge_side(sender)
        letter = "Q" if kind == "right" else "P"
        factors = algorithm.factors(sender)
        return {
            "kind": kind,
            "factors": {
                str(g): factors[f"{g}.{letter}"].detach().cpu().clone()
                for g in range(len(self.meta["groups"]))
            },
        }

    def decode(self, message):
        tensor, kind = message["tensor"], message["kind"]
        parts, offset = [], 0
        for g, (indices, rows, cols, r) in enumerate(self.meta["groups"]):
            width = rows if kind == "right" else cols
            size = len(indices) * r * width
            block = tensor[offset : offset + size].view(len(indices), r, width)
            parts.append(
                Part(
                    kind,
                    list(indices),
                    block=block,
                    factor=message["factors"][str(g)],
                    rows=rows,
                    cols=cols,
                )
            )
            offset += size
        exact = self.meta["exact_indices"]
        if exact and tensor.numel() > offset:  # the first half-step of a step
            parts.append(
                Part(
                    "model",
                    list(exact),
                    unflatten(tensor[offset:], [self.shapes[k] for k in exact]),
                )
            )
        return parts


class PowerGossip(GossipAlgorithm):
    """Low-rank compressed gossip with shared per-edge factors and warm-started power iteration.

    Args:
        params: tensors or `model.parameters()` / `named_parameters()`, updated in place.
        comm: a communicator (`MPICommunicator` or the one `LocalCluster.run` passes).
        rank: the rank r of the approximation of each matrix difference (clipped to the matrix's
            smaller side).
        num_iterations: half-steps per `step()`; each has its own message and update.
        gamma: consensus step; None uses the topology's `gamma`, the value exact gossip would use.
            One outside exact gossip's stable range (0, `topology.gamma_stable_max`) draws a
            warning (the low-rank step applies only part of each difference, so it may still work).
        warm_start: keep each factor for the next half-step (True) or redraw it from the edge's
            shared generator every time ("random restart", False).
        seed: base of the per-edge seeds.
        min_compression_rate: a matrix is compressed only if (rows + cols) * r * rate < rows * cols;
            otherwise it is gossiped exactly. 1 compresses whatever gets smaller; 0 compresses every
            matrix (useful in tests at full rank).
        batch_neighbors: compute the products for all neighbours in one multiplication and add
            their updates in one multiply-add (True), or one product and one update per neighbour
            (False: the same algorithm and messages, kept as the benchmark's comparison).

    Matrices of equal shape are stacked into one buffer and the parameters are re-pointed at slices
    of it (`param.data = ...`): their values and identities do not change, and the stacking costs no
    copy at each step. If something re-points them again (e.g. `model.to(device)`), the next step
    notices and re-stacks them.
    """

    name = "powergossip"
    #: On a static topology, `edge_noise` gets the send rows of every half-step after the products
    #: are written (the noise is on the projected messages per edge, the exact part included) and
    #: both ends form the factors from the noisy rows: the average is kept exactly, for any noise.
    #: Schedules do not call it (`privacy.mechanisms` refuses them).
    supports_edge_noise = True
    summary = "low-rank compressed gossip (PowerGossip), gamma defaults to the topology's"
    options = {
        "rank": Option("rank", int),
        "iters": Option("num_iterations", int),
        "gamma": Option("gamma", parse_optional_float),
        "warm": Option("warm_start", parse_bool),
        "seed": Option("seed", parse_seed),
        "min_compression_rate": Option("min_compression_rate", float),
        "batched": Option("batch_neighbors", parse_bool),
    }
    gamma_source = "topology"
    directed = False
    layout = LowRankProducts

    @classmethod
    def label(cls, options) -> str:
        text = f"PowerGossip r{options.get('rank', '1')}"
        if options.get("iters", "1") != "1":
            text += f" K{options['iters']}"
        if options.get("warm", "true").lower() in FALSE_WORDS:
            text += " restart"
        return text

    @staticmethod
    def _check_arguments(rank, num_iterations, min_compression_rate) -> None:
        if int(rank) != rank or rank < 1:
            raise ValueError(f"rank must be an integer >= 1, got {rank}")
        if int(num_iterations) != num_iterations or num_iterations < 1:
            raise ValueError(f"num_iterations must be an integer >= 1, got {num_iterations}")
        if min_compression_rate < 0:
            raise ValueError(f"min_compression_rate must be >= 0, got {min_compression_rate}")

    @classmethod
    def check_config(cls, kwargs, topology: AnyTopology) -> None:
        """The constructor's checks of rank, iterations and compression rate, from the spec alone."""
        cls._check_arguments(
            kwargs.get("rank", 1),
            kwargs.get("num_iterations", 1),
            kwargs.get("min_compression_rate", 1.0),
        )

    def __init__(
        self,
        params: ParamsLike,
        comm: Comm,
        rank: int = 1,
        num_iterations: int = 1,
        gamma: Optional[float] = None,
        warm_start: bool = True,
        seed: int = 0,
        min_compression_rate: float = 1.0,
        batch_neighbors: bool = True,
    ):
        require_undirected("PowerGossip", comm)
        super().__init__(params, comm)
        self._check_arguments(rank, num_iterations, min_compression_rate)
        self.rank = int(rank)
        self.num_iterations = int(num_iterations)
        self.gamma = resolve_gamma(gamma, comm)
        if gamma is not None:  # on a schedule, against the range of every one of its graphs
            warn_if_unstable_gamma("PowerGossip", self.gamma, comm.topology)
        self.warm_start = bool(warm_start)
        self.seed = check_seed(seed)
        self.min_compression_rate = float(min_compression_rate)
        self.batch_neighbors = bool(batch_neighbors)
        self.half_steps = 0

        me, neighbors = comm.rank, comm.neighbors
        # Static weights; on a schedule they are W(t)'s, looked up every step.
        self._weights = [comm.topology.weight(me, j) for j in neighbors] if comm.is_static else None
        #: Per union edge, the half-steps it has taken (schedules only: on a static topology every
        #: edge is always active and `half_steps` is every edge's counter).
        self._edge_half_steps = None if comm.is_static else {j: 0 for j in neighbors}
        # +1 at the smaller end of an edge, -1 at the larger: opposite updates preserve the average.
        self._signs = [1.0 if me < j else -1.0 for j in neighbors]
        self._generators = {
            j: torch.Generator(device="cpu").manual_seed(edge_seed(self.seed, me, j))
            for j in neighbors
        }

        self._groups = self._make_groups()
        self._exact_indices = [k for k in range(len(self.params)) if k not in self._compressed]
        self._exact: Optional[Tensor] = None  # the exactly gossiped tensors, which are views of it
        self._exact_views: List[Tensor] = []
        self._home_exact()
        self._exact_scratch = torch.empty_like(self._exact) if self._exact is not None else None
        self._make_messages()
        self._make_factors()
        self._make_plans()

    # ---- set-up --------------------------------------------------------------------------------
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

    # ---- the algorithm -------------------------------------------------------------------------
    def _step(self) -> None:
        if not self.comm.is_static:
            self._scheduled_step()
            return
        if not self.comm.neighbors:
            self.half_steps += self.num_iterations
            return
        self._check_homes()
        for iteration in range(self.num_iterations):
            self.half_steps += 1
            self._half_step(right=self.half_steps % 2 == 1, with_exact=iteration == 0)

    def _orthonormalize(self, plans: List["_SidePlan"], side: str) -> Optional[tuple]:
        """Orthonormalise the factors every group multiplies by on this side, in place; at rank 1,
        return that work instead, for the compiled call that computes the products to do first."""
        if not self.warm_start:
            for plan in plans:
                for block, j in zip(plan.blocks, self.comm.neighbors):
                    block.copy_(self._draw(j, block.shape))
        if self._factor_rows is not None:
            # Rank 1: orthonormalize_'s division by (norm + eps), with the eps added to all the
            # groups' norms in one operation; the same bits, since each is still its own vector's.
            return self._normalization[side]
        for plan in plans:
            if plan.factor_sets is not None:
                # Gram-Schmidt works on each (r, n) matrix on its own, so all neighbours' factors go
                # in one call; each edge's factor is the same shape at both ends: identical bits.
                orthonormalize_(plan.factor_sets)
            else:
                for block in plan.blocks:
                    orthonormalize_(block)
        return None

    def _half_step(self, right: bool, with_exact: bool) -> None:
        side = "right" if right else "left"
        plans = self._plans[side]
        has_exact = with_exact and self._exact is not None
        work = self._work[(side, has_exact)]

        # 1. Orthonormalise the factors we multiply by, compute all neighbours' products at once
        # ((M Q)^T or (M^T P)^T) and write them, with the exact part, into the messages.
        normalization = self._orthonormalize(plans, side) or self._no_normalization
        total = multiply_into_messages(*normalization, *work.multiply)
        if self.edge_noise is not None:
            # Per-edge noise on the projected messages (and the exact part), written into the send
            # rows, from which this end forms its factors too: both ends still form the same
            # factor, so each edge still adds +U and -U (the average is kept whatever the noise).
            outgoing = self._outgoing[(side, has_exact)]
            self.edge_noise(self.half_steps, self.comm.neighbors, self._weights, outgoing)
            total = None

        # 2. One message per neighbour, all computed from the models as they were before any update.
        send, recv = self._messages[(side, has_exact)]
        self._exchange(send, recv, outgoing=self._outgoing[(side, has_exact)], outgoing_sum=total)

        # 3. Both ends form the same new factor D Q (or D^T P), then the update of rank deg*r:
        # M += sum_j sigma_j gamma w_j P_j Q_j^T.
        form_factors_and_update(*work.update)

    # ---- on a schedule ---------------------------------------------------------------------------
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

    # ---- accounting and state ------------------------------------------------------------------
    def bytes_per_step(self) -> int:
        """Bytes this peer will send in its next `step()` (half-steps alternate right and left;
        on a schedule, to the next step's neighbours, each edge on its own side)."""
        has_exact = self._exact is not None
        size = torch.empty((), dtype=self.dtype).element_size()
        if not self.comm.is_static:
            total = sum(
                self._message_numel[(self._edge_side(j, ahead=1 + k), k == 0 and has_exact)]
                for j in self.comm.neighbors_at(self.steps)
                for k in range(self.num_iterations)
            )
            return total * size
        total, half = 0, self.half_steps
        for iteration in range(self.num_iterations):
            half += 1
            side = "right" if half % 2 == 1 else "left"
            total += self._message_numel[(side, iteration == 0 and has_exact)]
        return total * len(self.comm.neighbors) * size

    def edge_side(self, neighbor: int) -> str:
        """The side ("right" | "left") of the half-step in flight on the edge to `neighbor` (the
        last one taken, between steps). On a schedule each edge has its own counter."""
        if self._edge_half_steps is not None:
            return self._edge_side(neighbor, ahead=0)
        return "right" if self.half_steps % 2 == 1 else "left"

    @property
    def groups(self) -> List[list]:
        """The stacked groups as [indices, rows, cols, r], in message order (every peer's)."""
        return [[list(g.indices), g.rows, g.cols, g.rank] for g in self._groups]

    @property
    def compressed_indices(self) -> frozenset:
        """Positions (in the parameter list) of the tensors that travel in low-rank form; the
        others (vectors, matrices too small to compress) are sent exactly."""
        return frozenset(self._compressed)

    @property
    def compressed_fraction(self) -> float:
        """Share of the parameters (by count) that travel in low-rank form."""
        compressed = sum(self.params[k].numel() for k in self._compressed)
        return compressed / max(1, sum(t.numel() for t in self.params))

    def factors(self, neighbor: int) -> Dict[str, Tensor]:
        """The factors this peer shares with `neighbor`: views, P as (batch, rows, r) and Q as
        (batch, cols, r) for group number g under the keys "g.P" and "g.Q"."""
        n = self.comm.neighbors.index(neighbor)
        out = {}
        for index, g in enumerate(self._groups):
            out[f"{index}.P"] = g.block(g.left, n).transpose(1, 2)
            out[f"{index}.Q"] = g.block(g.right, n).transpose(1, 2)
        return out

    def state_dict(self) -> Dict[str, object]:
        state: Dict[str, object] = {
            "steps": self.steps,
            "half_steps": self.half_steps,
            "rank": self.rank,
            "seed": self.seed,
        }
        for j in self.comm.neighbors:
            for name, tensor in self.factors(j).items():
                state[f"factor.{j}.{name}"] = tensor.detach().cpu().clone()
            state[f"generator.{j}"] = self._generators[j].get_state()
            if self._edge_half_steps is not None:
                state[f"edge_half_steps.{j}"] = self._edge_half_steps[j]
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        if int(state["rank"]) != self.rank or int(state["seed"]) != self.seed:
            raise ValueError(
                f"PowerGossip state is for rank={state['rank']}, seed={state['seed']}; this instance "
                f"has rank={self.rank}, seed={self.seed}"
            )
        for j in self.comm.neighbors:
            load_tensors_(
                "PowerGossip",
                state,
                {f"factor.{j}.{name}": t for name, t in self.factors(j).items()},
            )
            self._generators[j].set_state(state[f"generator.{j}"])
            if self._edge_half_steps is not None:
                key = f"edge_half_steps.{j}"
                if key not in state:
                    raise ValueError(
                        f"PowerGossip state has no {key!r}: it was saved on a static "
                        "topology, and this run uses a schedule"
                    )
                self._edge_half_steps[j] = int(state[key])
        self.steps = int(state["steps"])
        self.half_steps = int(state["half_steps"])
