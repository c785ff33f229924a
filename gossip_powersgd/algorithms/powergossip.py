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
stacked, the products for all neighbours come from one multiplication and their updates are added
by one `baddbmm` of rank deg*r; on a static topology in two compiled calls (`powergossip_plan`).

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

The class composes the parts of its state, each with its own constructor (`powergossip_state`:
the stacked parameters, the message buffers, the per-edge factors and generators) and the plan of
its static half-step (`powergossip_plan`: the views and argument lists of the compiled work);
`powergossip_layout` is its message layout for observers. `reference.py` is the plain version of
the update, the spec that all of them are tested against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from ..comm.base import Tensor
from ..specs import FALSE_WORDS, check_seed, parse_bool, parse_optional_float, parse_seed
from .base import (
    GossipAlgorithm,
    Option,
    ParamsLike,
    constructor_defaults,
    require_undirected,
    step_weights,
    warn_if_unstable_gamma,
)
from .exact import check_gamma_positive, mix_exact, resolve_gamma
from .kernels import form_factors_and_update, multiply_into_messages
from .lowrank import check_compression_rate, orthonormalize_, warn_if_rank_unreachable
from .powergossip_layout import LowRankProducts
from .powergossip_plan import SidePlan, StaticPlan
from .powergossip_state import EdgeFactors, MessageBuffers, StackedParams, edge_seed

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology


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
            matrix (useful in tests at full rank); nan, inf and a rate that compresses none of the
            matrices that get smaller (exact gossip under this label) are refused.
        batch_neighbors: compute the products for all neighbours in one multiplication and add
            their updates in one multiply-add (True), or one product and one update per neighbour
            (False: the same algorithm and messages, kept as the benchmark's comparison).

    Matrices of equal shape are stacked into one buffer and the parameters are re-pointed at slices
    of it (`param.data = ...`): their values and identities do not change, and the stacking costs no
    copy at each step. Re-pointed again in the same dtype and device, they are re-stacked at the
    next step; a model moved to another dtype or device (`model.double()`, `model.to("cuda")`) or
    given new parameters (`load_state_dict(..., assign=True)`) is refused: build the algorithm after.
    """

    name = "powergossip"
    #: On a static topology, `edge_noise` gets the send rows of every half-step after the products
    #: are written (the noise is on the projected messages per edge, the exact part included) and
    #: both ends form the factors from the noisy rows: the average is kept exactly, for any noise.
    #: Schedules do not call it (`privacy.mechanisms` refuses them).
    supports_edge_noise = True
    #: Muffliato and DECOR (`GossipAlgorithm.supports_update_noise`).
    supports_update_noise = True
    #: A membership change carries each kept edge's factors, generator and half-step counter
    #: (`edge_state`); a new edge is seeded from (seed, min(i, j), max(i, j)) of the peer ids.
    supports_churn = True
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
        check_compression_rate(min_compression_rate)

    @classmethod
    def check_config(cls, kwargs, topology: AnyTopology) -> None:
        """The constructor's checks of rank, iterations, compression rate and γ, from the spec."""
        given = {**constructor_defaults(cls), **kwargs}
        cls._check_arguments(given["rank"], given["num_iterations"], given["min_compression_rate"])
        if given["gamma"] is not None:  # > 0; outside exact gossip's stable range: only a warning
            check_gamma_positive(given["gamma"])

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

        if comm.rank == 0:
            warn_if_rank_unreachable("powergossip", self.params, self.rank)
        self.stacks = StackedParams(self.params, self.rank, self.min_compression_rate)
        self.messages = MessageBuffers(self.stacks, comm.neighbors)
        self.edges = EdgeFactors(self.stacks, self.messages, comm, self.seed, self.gamma)
        self.plan = self._static_plan()

    def _static_plan(self) -> Optional[StaticPlan]:
        """The static half-step's views and compiled-work arguments (none on a schedule or without
        neighbours); taken again whenever the parameters are re-stacked (`_restack`)."""
        if self.comm.is_static and self.comm.neighbors:
            return StaticPlan(self.stacks, self.messages, self.edges, self.batch_neighbors)
        return None

    def _restack(self) -> None:
        if self.stacks.restack():
            self.plan = self._static_plan()

    # ---- the algorithm on a static topology ----------------------------------------------------
    def _step(self) -> None:
        if not self.comm.is_static:
            self._scheduled_step()
            return
        if not self.comm.neighbors:
            self.half_steps += self.num_iterations
            return
        self._restack()
        for iteration in range(self.num_iterations):
            self.half_steps += 1
            self._half_step(right=self.half_steps % 2 == 1, with_exact=iteration == 0)

    def _orthonormalize(self, plans: List[SidePlan], side: str) -> Optional[tuple]:
        """Orthonormalise the factors every group multiplies by on this side, in place; at rank 1,
        return that work instead, for the compiled call that computes the products to do first."""
        if not self.warm_start:
            for plan in plans:
                for block, j in zip(plan.blocks, self.comm.neighbors):
                    block.copy_(self.edges.draw(j, block.shape))
        if self.edges.factor_rows is not None:
            # Rank 1: orthonormalize_'s division by (norm + eps), with the eps added to all the
            # groups' norms in one operation; the same bits, since each is still its own vector's.
            return self.plan.normalization[side]
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
        has_exact = with_exact and self.stacks.exact is not None
        work, key = self.plan.work[(side, has_exact)], (side, has_exact)

        # 1. Orthonormalise the factors we multiply by, compute all neighbours' products at once
        # ((M Q)^T or (M^T P)^T) and write them, with the exact part, into the messages.
        normalization = self._orthonormalize(self.plan.sides[side], side)
        total = multiply_into_messages(
            *(normalization or self.plan.no_normalization), *work.multiply
        )
        if self.edge_noise is not None:
            # Per-edge noise on the projected messages (and the exact part), written into the send
            # rows, from which this end forms its factors too: both ends still form the same
            # factor, so each edge still adds +U and -U (the average is kept whatever the noise).
            outgoing = self.messages.outgoing[key]
            self.edge_noise(self.half_steps, self.comm.neighbors, self.edges.weights, outgoing)
            total = None

        # 2. One message per neighbour, all computed from the models as they were before any update.
        send, recv = self.messages.exchange[key]
        self._exchange(send, recv, outgoing=self.messages.outgoing[key], outgoing_sum=total)

        # 3. Both ends form the same new factor D Q (or D^T P), then the update of rank deg*r:
        # M += sum_j sigma_j gamma w_j P_j Q_j^T.
        form_factors_and_update(*work.update)

    # ---- the algorithm on a schedule -----------------------------------------------------------
    def _scheduled_step(self) -> None:
        step = self.steps
        active, weights = step_weights(self.comm, step)
        self.half_steps += self.num_iterations
        if not active:
            return
        self._restack()
        positions = [self.comm.neighbors.index(j) for j in active]
        for iteration in range(self.num_iterations):
            for j in active:
                self.edges.counters[j] += 1
            self._scheduled_half_step(step, active, positions, weights, with_exact=iteration == 0)

    def _scheduled_products(self, by_side: Dict[str, List[tuple]]) -> None:
        """Per side, orthonormalise the active edges' factors and multiply M by them together,
        into the messages."""
        for index, g in enumerate(self.stacks.groups):
            for side, edges in by_side.items():
                if not edges:
                    continue
                right = side == "right"
                factors = g.right if right else g.left
                for n, j in edges:
                    block = g.block(factors, n)
                    if not self.warm_start:
                        block.copy_(self.edges.draw(j, block.shape))
                    orthonormalize_(block)
                sends = self.messages.send_views[(index, side)]
                matrix = g.matrices.transpose(1, 2) if right else g.matrices
                if self.batch_neighbors:
                    rows = self.edges.vector_rows(g.rank, [n for n, _ in edges])
                    stacked = factors.index_select(1, rows)
                    products = torch.bmm(stacked, matrix)
                    for k, (_, j) in enumerate(edges):
                        sends[j].copy_(products[:, k * g.rank : (k + 1) * g.rank, :])
                else:
                    for n, j in edges:
                        torch.bmm(g.block(factors, n), matrix, out=sends[j])

    def _scheduled_half_step(
        self, step: int, active, positions: List[int], weights: List[float], with_exact: bool
    ) -> None:
        sides = {j: self.edges.side(j, ahead=0) for j in active}
        by_side = {
            side: [(n, j) for n, j in zip(positions, active) if sides[j] == side]
            for side in ("right", "left")
        }
        exact = self.stacks.exact if with_exact else None
        messages = self.messages

        # 1. The products of every active edge's side, and the exact part, into the messages.
        self._scheduled_products(by_side)
        for j in active if exact is not None else ():
            messages.send_views[("exact", sides[j])][j].copy_(exact)

        # 2. One message per active neighbour, sized for that edge's side.
        numel = {j: messages.numel[(sides[j], exact is not None)] for j in active}
        self._exchange(
            {j: messages.send[j][: numel[j]] for j in active},
            {j: messages.recv[j][: numel[j]] for j in active},
            step,
        )

        # 3. Both ends form the edge's new factor, then M += sum_j sigma_j gamma W(t)_ij P_j Q_j^T.
        signs = self.edges.signs
        scales = {j: signs[n] * self.gamma * w for n, j, w in zip(positions, active, weights)}
        for index, g in enumerate(self.stacks.groups):
            for side, edges in by_side.items():
                key = (index, side)
                sends, recvs = messages.send_views[key], messages.recv_views[key]
                new_factors = g.left if side == "right" else g.right
                for n, j in edges:
                    if self.comm.rank < j:
                        torch.sub(recvs[j], sends[j], out=g.block(new_factors, n))
                    else:
                        torch.sub(sends[j], recvs[j], out=g.block(new_factors, n))
            if self.batch_neighbors:
                rows = self.edges.vector_rows(g.rank, positions)
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
        if exact is not None:
            received = [messages.recv_views[("exact", sides[j])][j] for j in active]
            mix_exact(exact, received, weights, self.gamma, self.stacks.exact_scratch)

    # ---- accounting ----------------------------------------------------------------------------
    def bytes_per_step(self) -> int:
        """Bytes this peer will send in its next `step()` (half-steps alternate right and left;
        on a schedule, to the next step's neighbours, each edge on its own side)."""
        has_exact = self.stacks.exact is not None
        numel = self.messages.numel
        size = torch.empty((), dtype=self.dtype).element_size()
        if not self.comm.is_static:
            total = sum(
                numel[(self.edges.side(j, ahead=1 + k), k == 0 and has_exact)]
                for j in self.comm.neighbors_at(self.steps)
                for k in range(self.num_iterations)
            )
            return total * size
        total, half = 0, self.half_steps
        for iteration in range(self.num_iterations):
            half += 1
            side = "right" if half % 2 == 1 else "left"
            total += numel[(side, iteration == 0 and has_exact)]
        return total * len(self.comm.neighbors) * size

    def edge_side(self, neighbor: int) -> str:
        """The side ("right" | "left") of the half-step in flight on the edge to `neighbor` (the
        last one taken, between steps). On a schedule each edge has its own counter."""
        if self.edges.counters is not None:
            return self.edges.side(neighbor, ahead=0)
        return "right" if self.half_steps % 2 == 1 else "left"

    def next_exchange(self) -> List[tuple]:
        """What the next half-step's messages read, per group of stacked matrices (static
        topology): ``(matrices, factors, side)``, with `matrices` the group's (batch, rows, cols)
        buffer the parameters are views of, `side` "right" or "left", and `factors` every
        neighbour's factor that side multiplies by, side by side: (batch, deg*r, cols) on the right
        (each message is M Q), (batch, deg*r, rows) on the left (M^T P). The half-step
        orthonormalises each neighbour's factor first, which keeps its span."""
        if not self.comm.is_static:
            raise ValueError("next_exchange is for a static topology (a schedule's edges change)")
        self._restack()
        side = "right" if (self.half_steps + 1) % 2 == 1 else "left"
        groups = self.stacks.groups
        return [(g.matrices, g.right if side == "right" else g.left, side) for g in groups]

    @property
    def groups(self) -> List[list]:
        """The stacked groups as [indices, rows, cols, r], in message order (every peer's)."""
        return [[list(g.indices), g.rows, g.cols, g.rank] for g in self.stacks.groups]

    @property
    def compressed_indices(self) -> frozenset:
        """Positions (in the parameter list) of the tensors that travel in low-rank form; the
        others (vectors, matrices too small to compress) are sent exactly."""
        return frozenset(self.stacks.compressed)

    @property
    def compressed_fraction(self) -> float:
        """Share of the parameters (by count) that travel in low-rank form."""
        compressed = sum(self.params[k].numel() for k in self.stacks.compressed)
        return compressed / max(1, sum(t.numel() for t in self.params))

    def factors(self, neighbor: int) -> Dict[str, Tensor]:
        """The factors this peer shares with `neighbor`: views, P as (batch, rows, r) and Q as
        (batch, cols, r) for group number g under the keys "g.P" and "g.Q"."""
        return self.edges.factors(neighbor)

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, object]:
        state: Dict[str, object] = {
            "steps": self.steps,
            "half_steps": self.half_steps,
            "rank": self.rank,
            "seed": self.seed,
        }
        state.update(self.edges.state_dict())
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        if int(state["rank"]) != self.rank or int(state["seed"]) != self.seed:
            raise ValueError(
                f"PowerGossip state is for rank={state['rank']}, seed={state['seed']}; this instance "
                f"has rank={self.rank}, seed={self.seed}"
            )
        self.edges.load_state_dict(state)
        self.steps = int(state["steps"])
        self.half_steps = int(state["half_steps"])

    def node_state(self) -> Dict[str, object]:
        return {"steps": self.steps, "half_steps": self.half_steps}

    def load_node_state(self, state: Dict[str, object]) -> None:
        self.steps, self.half_steps = int(state["steps"]), int(state["half_steps"])

    def edge_state(self, neighbor: int) -> Dict[str, object]:
        """The edge's factors (copies), its generator and its half-step counter (on a static
        topology every edge's is `half_steps`)."""
        return self.edges.edge_state(neighbor, self.half_steps)

    def load_edge_state(self, neighbor: int, state: Dict[str, object]) -> None:
        self.edges.load_edge_state(neighbor, state)


__all__ = ["PowerGossip", "edge_seed"]
