"""Centralized baselines: exact all-reduce averaging, and PowerSGD with error feedback.

Both ignore the topology: every peer ends a step with the same bits (the communicator's ring
all-reduce adds the peers' chunks in a fixed order, see `Communicator.allreduce_`), and each peer
sends, and is charged, about 2(n-1)/n x the buffer's bytes (`comm.ring_allreduce_bytes`).

`AllReduce` averages the *parameters* (it is a drop-in for a gossip step: the models are equal after
every step). `PowerSGDAllReduce` averages the *gradients*, between `backward()` and
`optimizer.step()`, as PyTorch's DDP communication hook `powerSGD_hook` does (Vogels, Karimireddy,
Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization", NeurIPS
2019).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Dict, List

import torch

from ..comm.base import Tensor, ring_allreduce_bytes
from ..specs import check_seed, parse_bool, parse_seed
from .base import (
    FlatParams,
    GossipAlgorithm,
    NonFiniteError,
    Option,
    ParamsLike,
    constructor_defaults,
    load_tensors_,
)
from .layout import NoMessages
from .lowrank import (
    MatrixStack,
    check_compression_rate,
    matrix_stacks,
    orthonormalize_,
    refuse_rate_compressing_none,
    warn_if_rank_unreachable,
)

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology


def _allreduce_bytes(comm: Comm, numel: int, itemsize: int) -> int:
    """Bytes this peer sends in an all-reduce of `numel` elements (exactly what the ring moves)."""
    return ring_allreduce_bytes(numel, itemsize, comm.size, comm.rank)


class _Collective(GossipAlgorithm):
    """An algorithm that talks through all-reduces (training traffic, timed as communication)."""

    gamma_source = "none"
    directed = True  # no graph: the all-reduce ignores the topology
    layout = NoMessages

    def _allreduce(self, buffer: Tensor) -> None:
        start = time.perf_counter()
        self.comm.allreduce_(buffer, "mean")
        self.time_communication += time.perf_counter() - start


class AllReduce(_Collective):
    """Exact averaging of the parameters with one all-reduce per step (all tensors in one buffer)."""

    name = "allreduce"
    summary = "exact all-reduce average of the parameters (centralized)"
    options = {}

    @classmethod
    def label(cls, options) -> str:
        return "all-reduce"

    def __init__(self, params: ParamsLike, comm: Comm):
        super().__init__(params, comm)
        self._flat = FlatParams(self.params)

    def _step(self) -> None:
        x = self._flat.pack()
        if not bool(torch.isfinite(x).all()):
            self._raise_non_finite()
        self._allreduce(x)
        self._flat.unpack()

    def bytes_per_step(self) -> int:
        buffer = self._flat.buffer
        return _allreduce_bytes(self.comm, buffer.numel(), buffer.element_size())


@dataclasses.dataclass
class _ErrorFeedback(MatrixStack):
    """One matrix shape's compressed gradients: error memory, working matrix and factors, stacked."""

    memory: Tensor = None  # (batch, rows, cols): the error memory e; scratch for the approximation
    work: Tensor = None  # (batch, rows, cols): M = g + e
    P: Tensor = None  # (batch, rows, r): a view into the first all-reduce buffer
    Q: Tensor = (
        None  # (batch, cols, r): a view into the second all-reduce buffer, kept (warm start)
    )


class PowerSGDAllReduce(_Collective):
    """Centralized PowerSGD on the gradients, with error feedback and warm start.

    Call `step()` after `loss.backward()` and before `optimizer.step()`: it replaces every `p.grad`
    by the average over peers (compressed for the matrices, exact for the rest). Per step, for
    each compressed gradient G (viewed as rows = shape[0] x cols = the rest):

        M = G + e                                    (error feedback)
        P = M Q;     P <- mean over peers; orthonormalise the columns of P
        Q = M^T P;   Q <- mean over peers
        G <- P Q^T;  e <- M - P Q^T                  (what was not transmitted, kept for later)

    Q is kept from step to step (warm start) or redrawn from a generator seeded alike on all ranks.
    Every P (and the exactly averaged tensors) travels in one all-reduce, every Q in a second one.

    Args:
        params: the model's parameters (`model.parameters()` or `named_parameters()`); their
            `.grad` is read and overwritten.
        comm: a communicator.
        rank: rank r of the approximation (clipped to the matrix's smaller side).
        warm_start: keep Q between steps (True) or redraw it every step.
        start_iter: the first `start_iter` steps are plain exact all-reduces of the gradients
            (PyTorch's `start_powerSGD_iter`); the error memories start at zero after them.
        min_compression_rate: a matrix is compressed only if (rows + cols) * r * rate < rows * cols
            (PyTorch's rule); 1-D tensors and the others are averaged exactly. 0 compresses every
            matrix; nan, inf and a rate that compresses none of the matrices the default (2)
            compresses (an exact all-reduce under this label) are refused.
        seed: seed of the generator that draws Q (identical on all ranks).

    Frozen parameters (an `nn.Parameter` with ``requires_grad=False``) get no gradient from
    ``backward()`` and are left out, as the optimizer and DDP leave them out: their ``.grad`` stays
    as it is. The rule is every algorithm's (`frozen.py`): their values must agree between peers
    (checked at construction: nothing ever averages them), and unfreezing one after construction
    is refused at the step. A plain tensor is always averaged, whatever its ``requires_grad``: its
    ``.grad`` is set by hand, and a missing one is refused in one line rather than left unaveraged.

    Since every result comes out of an all-reduce, all ranks hold bit-identical gradients after a
    step.
    """

    name = "powersgd"
    summary = "centralized PowerSGD all-reduce of the gradients with error feedback (DDP hook)"
    options = {
        "rank": Option("rank", int),
        "warm": Option("warm_start", parse_bool),
        "start_iter": Option("start_iter", int),
        "min_compression_rate": Option("min_compression_rate", float),
        "seed": Option("seed", parse_seed),
    }

    @classmethod
    def label(cls, options) -> str:
        return f"PowerSGD all-reduce r{options.get('rank', '1')}"

    acts_on = "gradients"

    @staticmethod
    def _check_arguments(rank, start_iter, min_compression_rate) -> None:
        if int(rank) != rank or rank < 1:
            raise ValueError(f"rank must be an integer >= 1, got {rank}")
        if int(start_iter) != start_iter or start_iter < 0:
            raise ValueError(f"start_iter must be an integer >= 0, got {start_iter}")
        check_compression_rate(min_compression_rate)

    @classmethod
    def check_config(cls, kwargs, topology: AnyTopology) -> None:
        """The constructor's checks of rank, start_iter and compression rate, from the spec alone."""
        given = {**constructor_defaults(cls), **kwargs}
        cls._check_arguments(given["rank"], given["start_iter"], given["min_compression_rate"])

    def __init__(
        self,
        params: ParamsLike,
        comm: Comm,
        rank: int = 1,
        warm_start: bool = True,
        start_iter: int = 10,
        min_compression_rate: float = 2.0,
        seed: int = 0,
    ):
        super().__init__(params, comm)
        self._check_arguments(rank, start_iter, min_compression_rate)
        self.rank = int(rank)
        self.warm_start = bool(warm_start)
        self.start_iter = int(start_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.seed = check_seed(seed)
        self._generator = torch.Generator(device="cpu").manual_seed(self.seed)
        self._plain = None  # flat buffer of the plain all-reduce, allocated while it is used

        new = lambda *shape: torch.zeros(shape, dtype=self.dtype, device=self.device)  # noqa: E731
        if comm.rank == 0:
            warn_if_rank_unreachable("powersgd", self.params, self.rank)
        self._groups = matrix_stacks(
            _ErrorFeedback, self.params, self.rank, self.min_compression_rate
        )
        if not self._groups:  # a rate that compresses none of what the default compresses
            refuse_rate_compressing_none(
                "PowerSGDAllReduce",
                self.params,
                self.rank,
                self.min_compression_rate,
                default=constructor_defaults(type(self))["min_compression_rate"],
                runs_as="an exact all-reduce of the gradients",
                otherwise="raise start_iter (its steps are exact all-reduces)",
            )
        compressed = {k for g in self._groups for k in g.indices}
        self._exact_indices = [k for k in range(len(self.params)) if k not in compressed]

        # First all-reduce: every P, then the exactly averaged tensors. Second: every Q.
        p_numel = sum(g.batch * g.rows * g.rank for g in self._groups)
        exact_numel = sum(self.params[k].numel() for k in self._exact_indices)
        self._first = new(p_numel + exact_numel)
        self._second = new(sum(g.batch * g.cols * g.rank for g in self._groups))
        p_offset, q_offset = 0, 0
        for g in self._groups:
            b, rows, cols, r = g.batch, g.rows, g.cols, g.rank
            g.memory, g.work = new(b, rows, cols), new(b, rows, cols)
            g.P = self._first[p_offset : p_offset + b * rows * r].view(b, rows, r)
            g.Q = self._second[q_offset : q_offset + b * cols * r].view(b, cols, r)
            p_offset += b * rows * r
            q_offset += b * cols * r
            self._draw_q(g)
        self._exact_views, offset = [], p_offset
        for k in self._exact_indices:
            numel = self.params[k].numel()
            self._exact_views.append(self._first[offset : offset + numel])
            offset += numel
        comm.check_agreement(
            "PowerSGD configuration",
            f"{self.rank};{self.warm_start};{self.start_iter};"
            f"{self.min_compression_rate!r};{self.seed}",
        )

    def _draw_q(self, g: _ErrorFeedback) -> None:
        # Drawn on the CPU from the shared generator, then moved: CPU and GPU ranks agree.
        q = torch.randn(g.Q.shape, generator=self._generator, dtype=self.dtype)
        g.Q.copy_(q.to(self.device))
        orthonormalize_(
            g.Q.transpose(1, 2)
        )  # it takes (batch, r, n): the vectors along the last dim

    # ---- the algorithm -------------------------------------------------------------------------
    def _grads(self) -> List[Tensor]:
        grads = []
        for name, p in zip(self.names, self.params):
            g = p.grad
            if g is None:
                raise ValueError(
                    f"rank {self.comm.rank}: parameter {name} has no gradient (p.grad is None): call "
                    "PowerSGDAllReduce.step() after loss.backward(), and pass only parameters that "
                    "take part in the loss (every rank must average the same tensors)"
                )
            if g.shape != p.shape or g.dtype != p.dtype or g.device != p.device:
                raise ValueError(
                    f"rank {self.comm.rank}: the gradient of {name} is {tuple(g.shape)} "
                    f"{g.dtype} on {g.device}, unlike the parameter"
                )
            grads.append(g)
        return grads

    def _raise_non_finite_grads(self, grads: List[Tensor]) -> None:
        bad = [n for n, g in zip(self.names, grads) if not bool(torch.isfinite(g).all())]
        where = f"the gradient(s) of {', '.join(bad)}" if bad else "the error-feedback memory"
        raise NonFiniteError(
            f"rank {self.comm.rank}: non-finite values in {where} at step {self.steps}; nothing was "
            "sent (lower the learning rate or check the data)"
        )

    def _step(self) -> None:
        grads = self._grads()
        if self.steps < self.start_iter:
            self._plain_step(grads)
            return
        self._plain = None
        # 1. M = G + e; P = M Q (all matrices of one shape at once); the exact part beside the Ps.
        for g in self._groups:
            for slot, k in enumerate(g.indices):
                torch.add(grads[k].reshape(g.rows, g.cols), g.memory[slot], out=g.work[slot])
            if not self.warm_start:
                self._draw_q(g)
            torch.bmm(g.work, g.Q, out=g.P)
        for view, k in zip(self._exact_views, self._exact_indices):
            view.copy_(grads[k].reshape(-1))
        if not bool(torch.isfinite(self._first).all()):
            self._raise_non_finite_grads(grads)
        self._allreduce(self._first)
        # 2. Orthonormalise the averaged P; Q = M^T P, averaged.
        if self._groups:
            for g in self._groups:
                orthonormalize_(g.P.transpose(1, 2))
                torch.bmm(g.work.transpose(1, 2), g.P, out=g.Q)
            self._allreduce(self._second)
        # 3. G <- P Q^T; e <- M - P Q^T.
        for g in self._groups:
            approx = torch.bmm(g.P, g.Q.transpose(1, 2), out=g.memory)
            for slot, k in enumerate(g.indices):
                grads[k].copy_(approx[slot].view(grads[k].shape))
            torch.sub(g.work, approx, out=g.memory)
        for view, k in zip(self._exact_views, self._exact_indices):
            grads[k].copy_(view.view(grads[k].shape))

    def _plain_step(self, grads: List[Tensor]) -> None:
        if self._plain is None:
            self._plain = FlatParams(grads)
        else:
            self._plain.tensors = grads  # p.grad may be a new tensor at every backward()
        buffer = self._plain.pack()
        if not bool(torch.isfinite(buffer).all()):
            self._raise_non_finite_grads(grads)
        self._allreduce(buffer)
        for view, g in zip(self._plain.views, grads):
            g.copy_(view)

    # ---- accounting and state ------------------------------------------------------------------
    def bytes_per_step(self) -> int:
        """Bytes this peer sends in its next `step()` (plain before `start_iter`, compressed after)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        if self.steps < self.start_iter:
            return _allreduce_bytes(self.comm, sum(t.numel() for t in self.params), itemsize)
        first = _allreduce_bytes(self.comm, self._first.numel(), itemsize)
        second = _allreduce_bytes(self.comm, self._second.numel(), itemsize) if self._groups else 0
        return first + second

    @property
    def compressed_names(self) -> List[str]:
        """Names of the parameters whose gradients travel in low-rank form."""
        return [self.names[k] for g in self._groups for k in g.indices]

    def error_memory(self) -> Dict[str, Tensor]:
        """Parameter name -> its error-feedback memory e (a view, shaped like the parameter)."""
        out = {}
        for g in self._groups:
            for slot, k in enumerate(g.indices):
                out[self.names[k]] = g.memory[slot].view(self.params[k].shape)
        return out

    def factors(self) -> Dict[str, Tensor]:
        """Parameter name -> its Q factor (cols x r), a view; kept between steps if warm_start."""
        return {self.names[k]: g.Q[slot] for g in self._groups for slot, k in enumerate(g.indices)}

    def state_dict(self) -> Dict[str, object]:
        state: Dict[str, object] = {
            "steps": self.steps,
            "rank": self.rank,
            "seed": self.seed,
            "start_iter": self.start_iter,
            "warm_start": self.warm_start,
            "generator": self._generator.get_state(),
        }
        for name, tensor in self.error_memory().items():
            state[f"error.{name}"] = tensor.detach().cpu().clone()
        for name, tensor in self.factors().items():
            state[f"Q.{name}"] = tensor.detach().cpu().clone()
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        if int(state["rank"]) != self.rank or int(state["seed"]) != self.seed:
            raise ValueError(
                f"PowerSGDAllReduce state is for rank={state['rank']}, seed={state['seed']}; "
                f"this instance has rank={self.rank}, seed={self.seed}"
            )
        targets = {f"error.{n}": t for n, t in self.error_memory().items()}
        targets.update({f"Q.{n}": t for n, t in self.factors().items()})
        load_tensors_("PowerSGDAllReduce", state, targets)
        self._generator.set_state(state["generator"])
        self.steps = int(state["steps"])
