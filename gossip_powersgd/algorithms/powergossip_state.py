"""PowerGossip's memory, in three parts that `PowerGossip` builds in this order and composes:

* `StackedParams`: the parameters, stacked by matrix shape (one (batch, rows, cols) buffer per
  shape that they are views of), and the exactly gossiped tensors in one flat buffer;
* `MessageBuffers`: one preallocated send and receive buffer per neighbour and the views of every
  segment of a message (its layout is `powergossip_layout.LowRankProducts`');
* `EdgeFactors`: what this peer shares with each neighbour: the factors P and Q of every group,
  the edge's generator (the first factors and every restart are drawn from it) and, on a
  schedule, the edge's half-step counter.

Each part is built from the ones before it and plain arguments, and holds no reference to the
algorithm. `reference.py` says, plainly, what the factors and counters mean.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..comm.base import Tensor
from .base import load_tensors_
from .lowrank import MatrixStack, matrix_stacks, ortho_eps, refuse_rate_compressing_none

if TYPE_CHECKING:
    from ..comm.base import Comm


def edge_seed(seed: int, i: int, j: int) -> int:
    """A seed both ends of edge {i, j} derive alike, without collisions between edges (unlike joined
    decimal strings, where (1, 12) and (11, 2) collide)."""
    small, big = min(i, j), max(i, j)
    state = np.random.SeedSequence([seed, small, big]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & 0x7FFF_FFFF_FFFF_FFFF


#: Alignment of each neighbour's message buffer (that of PyTorch's CPU allocator).
ALIGN_BYTES = 64


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def aligned_numel(dtype: torch.dtype) -> int:
    """Elements of `dtype` in `ALIGN_BYTES` (at least 1)."""
    return max(1, ALIGN_BYTES // torch.empty((), dtype=dtype).element_size())


def segments_of(rows: Tensor, offset: int, batch: int, *inner: int) -> Tensor:
    """The (batch, deg, *inner) view of every row's segment that starts at `offset` of a
    (deg, width) tensor: neighbour n's (batch, *inner) block is row n's segment."""
    size = batch * int(np.prod(inner))
    return rows[:, offset : offset + size].view(rows.shape[0], batch, *inner).transpose(0, 1)


@dataclasses.dataclass
class MatrixGroup(MatrixStack):
    """One matrix shape's parameters, stacked, with the factors shared with every neighbour.

    The factors of all neighbours sit side by side, vector-major: neighbour number n owns rows
    n*r:(n+1)*r of `right` (its Q^T, batch x r x cols) and of `left` (its P^T, batch x r x rows).
    """

    matrices: Optional[Tensor] = None  # (batch, rows, cols): the parameters themselves (views)
    right: Optional[Tensor] = None  # (batch, deg*r, cols): every neighbour's Q^T
    left: Optional[Tensor] = None  # (batch, deg*r, rows): every neighbour's P^T
    scaled_left: Optional[Tensor] = None  # (batch, deg*r, rows): P^T times sigma*gamma*W
    products_right: Optional[Tensor] = None  # (batch, deg*r, rows) = (M Q)^T for every neighbour
    products_left: Optional[Tensor] = None  # (batch, deg*r, cols) = (M^T P)^T for every neighbour
    scales: Optional[Tensor] = None  # (1, deg*r, 1): sigma * gamma * W[i, j] for each factor vector


class StackedParams:
    """The parameters as PowerGossip works on them: `groups` (one `MatrixGroup` per compressed
    matrix shape, in the same order on every peer) and `exact`, one flat buffer that the exactly
    gossiped tensors (`exact_indices`) are views of (None when there are none).

    The parameters are re-pointed at slices of these buffers (`param.data = ...`): their values and
    identities do not change. `restack()` re-stacks whatever was re-pointed since, in the same
    dtype on the same device (`param.data = ...`); a parameter moved to another dtype or device
    (`model.double()`, `model.to("cuda")`) is refused: the buffers, messages and factors are all
    of the dtype and device the algorithm was built on."""

    def __init__(self, params: List[Tensor], rank: int, min_compression_rate: float):
        self.params = params
        self.dtype, self.device = params[0].dtype, params[0].device
        self.groups: List[MatrixGroup] = matrix_stacks(
            MatrixGroup, params, rank, min_compression_rate
        )
        if not self.groups:  # a rate that compresses none of what would get smaller: refused
            refuse_rate_compressing_none("PowerGossip", params, rank, min_compression_rate)
        self.compressed = {k for g in self.groups for k in g.indices}
        for group in self.groups:
            self._home(group)
        self.exact_indices = [k for k in range(len(params)) if k not in self.compressed]
        self.exact: Optional[Tensor] = None  # the exactly gossiped tensors are views of it
        self.exact_views: List[Tensor] = []
        self._home_exact()
        self.exact_scratch = torch.empty_like(self.exact) if self.exact is not None else None
        self._note_homes()

    def _home(self, group: MatrixGroup) -> None:
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
        if not self.exact_indices:
            return
        if self.exact is None:
            total = sum(self.params[k].numel() for k in self.exact_indices)
            self.exact = torch.empty(total, dtype=self.dtype, device=self.device)
            offset = 0
            for k in self.exact_indices:
                size = self.params[k].numel()
                self.exact_views.append(self.exact[offset : offset + size])
                offset += size
        for k, flat in zip(self.exact_indices, self.exact_views):
            tensor = self.params[k]
            flat.copy_(tensor.detach().reshape(-1))
            tensor.data = flat.view(tensor.shape)

    def _note_homes(self) -> None:
        """Where each parameter's data starts now, for `restack`'s one comparison per step."""
        homes = [(k, g.matrices[slot]) for g in self.groups for slot, k in enumerate(g.indices)]
        homes += list(zip(self.exact_indices, self.exact_views))
        self._home_indices = [k for k, _ in homes]
        self._home_ptrs = [home.data_ptr() for _, home in homes]

    def restack(self) -> bool:
        """Re-stack whatever has been re-pointed since the last call; True when anything had been
        (then every view of the groups' buffers must be taken again). A parameter now of another
        dtype or on another device is refused in one line (copied into the buffers it would be
        converted back silently, or a single-matrix group would fail in the kernels)."""
        params = self.params
        # one comparison of two lists: this runs at every step
        if [params[k].data_ptr() for k in self._home_indices] == self._home_ptrs:
            return False
        for k in self._home_indices:
            if (params[k].dtype, params[k].device) != (self.dtype, self.device):
                raise ValueError(
                    f"PowerGossip: the model moved to {params[k].dtype}/{params[k].device} after "
                    f"the algorithm was built (on {self.dtype}/{self.device}): build it after "
                    "model.to(...)"
                )
        for group in self.groups:
            for slot, k in enumerate(group.indices):
                if params[k].data_ptr() != group.matrices[slot].data_ptr():
                    self._home(group)
                    break
        for k, flat in zip(self.exact_indices, self.exact_views):
            if params[k].data_ptr() != flat.data_ptr() or params[k].numel() != flat.numel():
                self._home_exact()
                break
        self._note_homes()
        return True


class MessageBuffers:
    """One preallocated send and receive buffer per neighbour, with views for every segment.

    Layout of a message: for each group, its products (batch x r x rows on a right half-step,
    (M Q)^T; batch x r x cols on a left one, (M^T P)^T), then, on the first half-step of a
    step, the exact part. The neighbours' buffers are the rows of one (deg, capacity) tensor,
    so that a segment of every neighbour's message is one strided view.
    """

    def __init__(self, stacks: StackedParams, neighbors: Sequence[int]):
        groups, dtype, device = stacks.groups, stacks.dtype, stacks.device
        right = sum(g.batch * g.rows * g.rank for g in groups)
        left = sum(g.batch * g.cols * g.rank for g in groups)
        exact = stacks.exact.numel() if stacks.exact is not None else 0
        #: (side, with the exact part) -> elements of such a message
        self.numel = {
            (side, with_exact): size + (exact if with_exact else 0)
            for side, size in (("right", right), ("left", left))
            for with_exact in (False, True)
        }
        # Rows start on 64-byte boundaries, as separately allocated buffers do: a BLAS kernel
        # writing a product into a message may round differently at another alignment.
        capacity = round_up(max(right, left) + exact, aligned_numel(dtype))
        self.send_rows = torch.zeros((len(neighbors), capacity), dtype=dtype, device=device)
        self.recv_rows = torch.zeros_like(self.send_rows)
        self.send = {j: self.send_rows[n] for n, j in enumerate(neighbors)}
        self.recv = {j: self.recv_rows[n] for n, j in enumerate(neighbors)}
        #: Segment offsets: (group index or "exact", side) -> (offset, size).
        self.segments: Dict[tuple, tuple] = {}
        #: Segment views: (group index, side) -> neighbour -> view; ("exact", side) likewise.
        self.send_views: Dict[tuple, Dict[int, Tensor]] = {}
        self.recv_views: Dict[tuple, Dict[int, Tensor]] = {}
        both = ((self.send_views, self.send), (self.recv_views, self.recv))
        for side in ("right", "left"):
            offset = 0
            for index, g in enumerate(groups):
                shape = (g.batch, g.rank, g.rows if side == "right" else g.cols)
                size = shape[0] * shape[1] * shape[2]
                self.segments[(index, side)] = (offset, size)
                for views, buffers in both:
                    views[(index, side)] = {
                        j: buffers[j][offset : offset + size].view(shape) for j in neighbors
                    }
                offset += size
            self.segments[("exact", side)] = (offset, exact)
            for views, buffers in both:
                views[("exact", side)] = {j: buffers[j][offset : offset + exact] for j in neighbors}
        #: The exchange's buffers, sliced to each message's size once: key of `numel` -> dicts.
        self.exchange = {
            key: (
                {j: self.send[j][:numel] for j in neighbors},
                {j: self.recv[j][:numel] for j in neighbors},
            )
            for key, numel in self.numel.items()
        }
        #: All of those messages at once, for the finiteness check before they leave.
        self.outgoing = {key: self.send_rows[:, :numel] for key, numel in self.numel.items()}


class EdgeFactors:
    """What this peer shares with each neighbour j: the factors of every group (in the groups'
    `right` and `left` buffers, neighbour by neighbour), the edge's generator, seeded from
    `edge_seed(seed, me, j)`, and on a schedule (`static` False) the edge's half-step counter.

    `signs` are +1 towards a larger neighbour and -1 towards a smaller one; `weights` W[i, j] per
    neighbour on a static topology (None on a schedule: scaled per step). At rank 1 the factors of
    all groups sit in (deg, width) rows laid out as the messages they are formed from (a left
    factor like a right half-step's message, and the other way round): forming every group's new
    factor is then one subtraction per run of neighbours, and scaling them one multiplication."""

    def __init__(
        self, stacks: StackedParams, messages: MessageBuffers, comm: Comm, seed: int, gamma: float
    ):
        self.me, self.neighbors, self.gamma = comm.rank, list(comm.neighbors), gamma
        self.dtype, self.device = stacks.dtype, stacks.device
        me, neighbors = self.me, self.neighbors
        # Static weights; on a schedule they are W(t)'s, looked up every step.
        self.weights = [comm.topology.weight(me, j) for j in neighbors] if comm.is_static else None
        # +1 at the smaller end of an edge, -1 at the larger: opposite updates keep the average.
        self.signs = [1.0 if me < j else -1.0 for j in neighbors]
        self.generators = {
            j: torch.Generator(device="cpu").manual_seed(edge_seed(seed, me, j)) for j in neighbors
        }
        #: Per union edge, the half-steps it has taken (schedules only: on a static topology every
        #: edge is always active and the algorithm's `half_steps` is every edge's counter).
        self.counters: Optional[Dict[int, int]] = None
        if not comm.is_static:
            self.counters = {j: 0 for j in neighbors}
        self.groups = stacks.groups
        self._allocate(messages)

    def _allocate(self, messages: MessageBuffers) -> None:
        deg, groups = len(self.neighbors), self.groups
        # sigma * gamma * W[i, j] per factor vector, to scale all neighbours' P in one multiply
        weights = self.weights if self.weights is not None else [0.0] * deg
        scales = [self.signs[n] * self.gamma * weights[n] for n in range(deg)]
        new = lambda *shape: torch.zeros(shape, dtype=self.dtype, device=self.device)  # noqa: E731
        self.factor_rows: Optional[Dict[str, Tensor]] = None
        if groups and all(g.rank == 1 for g in groups):
            align = aligned_numel(self.dtype)
            left = round_up(messages.numel[("right", False)], align)
            right = round_up(messages.numel[("left", False)], align)
            self.factor_rows = {
                "left": new(deg, left),
                "right": new(deg, right),
                "scaled_left": new(deg, left),
            }
            self.scale_column = torch.tensor(scales, dtype=self.dtype, device=self.device).view(
                deg, 1
            )
            # One norm per factor vector, for the vectors multiplied by on each side, so that the
            # epsilon is added to all of them at once; a tensor, not a Python number, because
            # a number would be converted into one at every call.
            vectors = deg * sum(g.batch for g in groups)
            self.norm_rows = {"right": new(vectors), "left": new(vectors)}
            self.epsilon = torch.tensor(ortho_eps(self.dtype), dtype=self.dtype, device=self.device)
        for index, group in enumerate(groups):
            b, rows, cols, r = group.batch, group.rows, group.cols, group.rank
            if self.factor_rows is None:
                group.right = new(b, deg * r, cols)
                group.left = new(b, deg * r, rows)
                group.scaled_left = new(b, deg * r, rows)
            else:
                rows_of, at = self.factor_rows, messages.segments
                group.right = segments_of(rows_of["right"], at[(index, "left")][0], b, cols)
                group.left = segments_of(rows_of["left"], at[(index, "right")][0], b, rows)
                group.scaled_left = segments_of(
                    rows_of["scaled_left"], at[(index, "right")][0], b, rows
                )
            group.products_right = new(b, deg * r, rows)
            group.products_left = new(b, deg * r, cols)
            for n, j in enumerate(self.neighbors):
                group.block(group.right, n).copy_(self.draw(j, (b, r, cols)))
            group.scales = torch.tensor(
                [scales[n] for n in range(deg) for _ in range(r)],
                dtype=self.dtype,
                device=self.device,
            ).view(1, deg * r, 1)

    def draw(self, j: int, shape) -> Tensor:
        """A fresh factor from edge j's generator: drawn on the CPU, then moved, so that a CPU
        peer and a GPU peer agree."""
        return torch.randn(shape, generator=self.generators[j], dtype=self.dtype).to(self.device)

    def side(self, j: int, ahead: int = 1) -> str:
        """On a schedule, the side of edge j's half-step `ahead` half-steps from now (odd counts
        are right)."""
        return "right" if (self.counters[j] + ahead) % 2 == 1 else "left"

    def vector_rows(self, r: int, positions: List[int]) -> Tensor:
        """Indices of the factor vectors (of a group of rank r) of the neighbours at `positions`,
        block by block."""
        return torch.tensor([n * r + k for n in positions for k in range(r)], device=self.device)

    def factors(self, neighbor: int) -> Dict[str, Tensor]:
        """The factors shared with `neighbor`: views, P as (batch, rows, r) and Q as
        (batch, cols, r) for group number g under the keys "g.P" and "g.Q"."""
        n = self.neighbors.index(neighbor)
        out = {}
        for index, g in enumerate(self.groups):
            out[f"{index}.P"] = g.block(g.left, n).transpose(1, 2)
            out[f"{index}.Q"] = g.block(g.right, n).transpose(1, 2)
        return out

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, object]:
        """Per neighbour j: "factor.{j}.{g}.P" and "factor.{j}.{g}.Q" (copies, on the CPU),
        "generator.{j}" and, on a schedule, "edge_half_steps.{j}"."""
        state: Dict[str, object] = {}
        for j in self.neighbors:
            for name, tensor in self.factors(j).items():
                state[f"factor.{j}.{name}"] = tensor.detach().cpu().clone()
            state[f"generator.{j}"] = self.generators[j].get_state()
            if self.counters is not None:
                state[f"edge_half_steps.{j}"] = self.counters[j]
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Load what `state_dict` wrote, refusing a state of another model, topology or kind of
        topology with an error naming the key."""
        if self.counters is None and any(str(key).startswith("edge_half_steps.") for key in state):
            raise ValueError(
                "PowerGossip state has per-edge counters ('edge_half_steps.<j>'): it was saved "
                "on a schedule, and this run uses a static topology; resume on that schedule"
            )
        for j in self.neighbors:
            load_tensors_(
                "PowerGossip",
                state,
                {f"factor.{j}.{name}": t for name, t in self.factors(j).items()},
            )
            self.generators[j].set_state(state[f"generator.{j}"])
            if self.counters is not None:
                key = f"edge_half_steps.{j}"
                if key not in state:
                    raise ValueError(
                        f"PowerGossip state has no {key!r}: it was saved on a static "
                        "topology, and this run uses a schedule; resume on that topology"
                    )
                self.counters[j] = int(state[key])

    def edge_state(self, neighbor: int, half_steps: int) -> Dict[str, object]:
        """The edge's factors (copies), its generator and its half-step counter (on a static
        topology, `half_steps`: every edge's)."""
        state: Dict[str, object] = {k: t.clone() for k, t in self.factors(neighbor).items()}
        state["generator"] = self.generators[neighbor].get_state()
        counters = self.counters
        state["half_steps"] = counters[neighbor] if counters is not None else half_steps
        return state

    def load_edge_state(self, neighbor: int, state: Dict[str, object]) -> None:
        """Load what `edge_state` returned (on a schedule only: a static edge keeps no counter)."""
        for key, tensor in self.factors(neighbor).items():
            tensor.copy_(state[key])
        self.generators[neighbor].set_state(state["generator"])
        if self.counters is None:
            raise ValueError("PowerGossip on a static topology keeps no per-edge counters")
        self.counters[neighbor] = int(state["half_steps"])


__all__ = ["edge_seed", "MatrixGroup", "StackedParams", "MessageBuffers", "EdgeFactors"]
