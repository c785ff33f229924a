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

The class is split by job: this module holds its options, its static half-step, its accounting
and state; `powergossip_buffers` its set-up (stacks, factors, messages, compiled-work arguments),
`powergossip_schedule` its step on a schedule (both mixins of `PowerGossip`), and
`powergossip_layout` its message layout for observers. `reference.py` is the plain version of the
update that all of them are tested against.
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
    load_tensors_,
    require_undirected,
    warn_if_unstable_gamma,
)
from .exact import resolve_gamma
from .kernels import form_factors_and_update, multiply_into_messages
from .lowrank import orthonormalize_, warn_if_rank_unreachable
from .powergossip_buffers import (  # noqa: F401 (edge_seed: importable from here, as before)
    PowerGossipBuffers,
    _EdgeFactors,
    _SidePlan,
    edge_seed,
)
from .powergossip_layout import LowRankProducts
from .powergossip_schedule import PowerGossipSchedule

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology


class PowerGossip(PowerGossipSchedule, PowerGossipBuffers, GossipAlgorithm):
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

        if me == 0:
            warn_if_rank_unreachable("powergossip", self.params, self.rank)
        self._groups = self._make_groups()
        self._exact_indices = [k for k in range(len(self.params)) if k not in self._compressed]
        self._exact: Optional[Tensor] = None  # the exactly gossiped tensors, which are views of it
        self._exact_views: List[Tensor] = []
        self._home_exact()
        self._exact_scratch = torch.empty_like(self._exact) if self._exact is not None else None
        self._make_messages()
        self._make_factors()
        self._make_plans()

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

    def next_exchange(self) -> List[tuple]:
        """What the next half-step's messages read, per group of stacked matrices (static
        topology): ``(matrices, factors, side)``, with `matrices` the group's (batch, rows, cols)
        buffer the parameters are views of, `side` "right" or "left", and `factors` every
        neighbour's factor that side multiplies by, side by side: (batch, deg*r, cols) on the right
        (each message is M Q), (batch, deg*r, rows) on the left (M^T P). The half-step
        orthonormalises each neighbour's factor first, which keeps its span."""
        if not self.comm.is_static:
            raise ValueError("next_exchange is for a static topology (a schedule's edges change)")
        self._check_homes()
        side = "right" if (self.half_steps + 1) % 2 == 1 else "left"
        return [(g.matrices, g.right if side == "right" else g.left, side) for g in self._groups]

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

    def node_state(self) -> Dict[str, object]:
        return {"steps": self.steps, "half_steps": self.half_steps}

    def load_node_state(self, state: Dict[str, object]) -> None:
        self.steps, self.half_steps = int(state["steps"]), int(state["half_steps"])

    def edge_state(self, neighbor: int) -> Dict[str, object]:
        """The edge's factors (copies), its generator and its half-step counter (on a static
        topology every edge's is `half_steps`)."""
        state: Dict[str, object] = {k: t.clone() for k, t in self.factors(neighbor).items()}
        state["generator"] = self._generators[neighbor].get_state()
        counters = self._edge_half_steps
        state["half_steps"] = counters[neighbor] if counters is not None else self.half_steps
        return state

    def load_edge_state(self, neighbor: int, state: Dict[str, object]) -> None:
        for key, tensor in self.factors(neighbor).items():
            tensor.copy_(state[key])
        self._generators[neighbor].set_state(state["generator"])
        if self._edge_half_steps is None:
            raise ValueError("PowerGossip on a static topology keeps no per-edge counters")
        self._edge_half_steps[neighbor] = int(state["half_steps"])

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
