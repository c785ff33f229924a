"""What every gossip algorithm shares: the parameter list (frozen parameters left out), the start-up
agreement check, packing tensors into one message, and the finiteness guard on everything sent."""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
import time
import warnings
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import torch

from ..comm.base import Tensor
from ..errors import NonFiniteError  # noqa: F401 (re-exported)
from .frozen import check_frozen_agree, check_still_frozen, leave_frozen_out

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology

ParamsLike = Union[Iterable[Tensor], Iterable[Tuple[str, Tensor]]]


def named_tensors(params: ParamsLike) -> Tuple[List[str], List[Tensor]]:
    """Accept `model.parameters()`, `model.named_parameters()` or a list of tensors."""
    names, tensors = [], []
    for k, item in enumerate(params):
        if isinstance(item, tuple):
            name, tensor = item
        else:
            name, tensor = f"param[{k}]", item
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} is a {type(tensor).__name__}, not a torch.Tensor")
        names.append(name)
        tensors.append(tensor)
    return names, tensors


def refuse_repeated_tensors(names: Sequence[str], tensors: Sequence[Tensor]) -> None:
    """Refuse one tensor passed twice (a tied weight listed once per module that uses it): each
    copy would be gossiped and counted on its own, so the bytes double and the low-rank
    algorithms step it as two matrices, silently unlike the same model with the tensor once."""
    first: Dict[int, str] = {}
    for name, tensor in zip(names, tensors):
        if id(tensor) in first:
            raise ValueError(
                f"{name} is the same tensor as {first[id(tensor)]} (a tied weight?): pass each "
                "tensor once, e.g. model.parameters(), which lists a shared one once"
            )
        first[id(tensor)] = name


def signature(names: Sequence[str], tensors: Sequence[Tensor]) -> str:
    """What all peers must agree on: shapes and dtypes (names are not compared, shapes are)."""
    return ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors)


class ReplacedParameterWatch:
    """Notes the first of `tensors` that its module replaces by another tensor after the algorithm
    was built (`model.load_state_dict(sd, assign=True)`, `layer.weight = nn.Parameter(...)`): the
    algorithm holds the old tensors and would go on gossiping them while the model trains the new
    ones, silently. Torch's global parameter-registration hook sees every such assignment before
    it is made. One hook serves every watch of the process (`_noticed`), registered once and never
    removed: removing a hook when a watch is collected could come during torch's own loop over its
    hooks (a garbage collection inside a parameter's registration) and break it. A re-pointed
    `param.data` or a swapped tensor (`torch.utils.swap_tensors`) keeps the object and is not a
    replacement."""

    _live: "weakref.WeakSet[ReplacedParameterWatch]" = weakref.WeakSet()
    _lock = threading.Lock()  # peers' threads build algorithms while others register parameters
    _hooked = False

    def __init__(self, names: Sequence[str], tensors: Sequence[Tensor]):
        self.ours = {id(t): name for name, t in zip(names, tensors)}
        self.replaced: List[str] = []  # "name (Module.attribute)"
        cls = ReplacedParameterWatch
        with cls._lock:
            if not cls._hooked:
                from torch.nn.modules.module import register_module_parameter_registration_hook

                register_module_parameter_registration_hook(_noticed)
                cls._hooked = True
            cls._live.add(self)

    def check(self, who: str) -> None:
        """Raise a one-line ValueError naming the replaced parameter and the fix, if there is one."""
        if self.replaced:
            raise ValueError(
                f"{who}: the model's parameter {self.replaced[0]} was replaced after the algorithm "
                "was built (load_state_dict(..., assign=True)?), so it would gossip the old one: "
                "build the algorithm after loading, or load without assign=True"
            )


def _noticed(module, attribute: str, param) -> None:
    """The parameter-registration hook of every `ReplacedParameterWatch`: `module.attribute` is
    about to become `param`; a watch holding the tensor it replaces notes it."""
    old = module.__dict__.get("_parameters", {}).get(attribute)
    if old is None or old is param:
        return
    with ReplacedParameterWatch._lock:
        watches = list(ReplacedParameterWatch._live)
    for watch in watches:
        name = watch.ours.get(id(old))
        if name is not None and not watch.replaced:
            watch.replaced.append(f"{name} ({type(module).__name__}.{attribute})")


class FlatParams:
    """A preallocated contiguous copy of a list of same-dtype tensors, for one-message gossip."""

    def __init__(self, tensors: Sequence[Tensor]):
        self.tensors = list(tensors)
        total = sum(t.numel() for t in self.tensors)
        first = self.tensors[0] if self.tensors else torch.empty(0)
        self.buffer = torch.empty(total, dtype=first.dtype, device=first.device)
        self.views, offset = [], 0
        for t in self.tensors:
            self.views.append(self.buffer[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()

    def pack(self) -> Tensor:
        for view, t in zip(self.views, self.tensors):
            view.copy_(t.detach())
        return self.buffer

    def unpack(self) -> None:
        with torch.no_grad():
            for view, t in zip(self.views, self.tensors):
                t.copy_(view)


def all_finite(tensor: Tensor, total: Optional[float] = None) -> bool:
    """True when no element is a NaN or an infinity, in two operations for the common case.

    A NaN or an infinity anywhere makes the sum NaN or infinite, so a finite sum proves the tensor
    finite; only a non-finite sum (a real NaN, or finite values whose sum overflows) is checked
    element by element. Half-precision sums accumulate in float32, where they rarely overflow.
    `total`, when given, is that sum, already computed (e.g. by `kernels.multiply_into_messages`).
    """
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return True
    if total is None:
        accumulate = torch.float32 if tensor.element_size() < 4 else None
        total = float(tensor.sum(dtype=accumulate))
    if math.isfinite(total):
        return True
    return bool(torch.isfinite(tensor).all())


def load_tensors_(who: str, state: Dict[str, object], targets: Dict[str, Tensor]) -> None:
    """Copy `state[key]` into each target tensor, refusing a missing key or a different shape
    (a state saved for another model or topology) with an error naming the key."""
    for key, tensor in targets.items():
        if key not in state:
            raise ValueError(
                f"{who} state has no {key!r}: it was saved for another model or topology"
            )
        saved = state[key]
        if tuple(saved.shape) != tuple(tensor.shape):
            raise ValueError(
                f"{who} state {key!r} has shape {tuple(saved.shape)}, "
                f"expected {tuple(tensor.shape)}"
            )
        tensor.copy_(saved)


def warn_if_unstable_gamma(who: str, gamma: float, topology: AnyTopology) -> None:
    """Warn (once per call) when `gamma` is outside the stable range of exact gossip on `topology`.

    For compressed gossip this is a warning, not an error: its effective step is not γ (only part
    of each difference is applied per round), so a γ that exact gossip cannot take may still work.
    """
    try:
        topology.check_gamma(gamma)
    except ValueError as exc:
        warnings.warn(f"{who}: {exc}", UserWarning, stacklevel=3)


def require_undirected(who: str, comm: Comm) -> None:
    """Refuse a directed topology: the algorithm pairs every message with one coming back."""
    if comm.is_directed:
        raise ValueError(
            f"{who} needs symmetric edges, but the topology {comm.topology.name!r} is "
            "directed: use algorithm pushsum on directed graphs, or an undirected topology"
        )


def step_weights(comm: Comm, step: int) -> Tuple[Tuple[int, ...], List[float]]:
    """The neighbours of `step` and their weights W(step)[i, j], in neighbour order."""
    graph = comm.topology_at(step)
    neighbors = tuple(graph.neighbors(comm.rank))
    return neighbors, [graph.weight(comm.rank, j) for j in neighbors]


@dataclasses.dataclass(frozen=True)
class Option:
    """One key of an algorithm's spec: the constructor's keyword argument it sets, and how its text
    is parsed (its type). The default is the constructor's (`registry` reads it from there)."""

    argument: str
    parse: Callable[[str], Any]
    help: str = ""


def constructor_defaults(cls) -> Dict[str, Any]:
    """The constructor's keyword arguments and their defaults (`inspect.Parameter.empty` for
    none): the defaults of the spec options that set them."""
    parameters = inspect.signature(cls.__init__).parameters
    return {
        name: p.default
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


class GossipAlgorithm:
    """Base class: holds the parameters (updated in place) and the communicator.

    Construction is collective: every peer checks that all peers hold parameters of the same shapes
    and dtypes, and fails with the same `AgreementError` on every rank otherwise.

    Frozen parameters (an `nn.Parameter` with ``requires_grad=False``) are left out, as the
    optimizer and DDP leave them out (`frozen.py`): they are neither sent nor counted in
    `bytes_per_step` and stay bit for bit as they are. Their values must be equal on every peer
    (checked at construction; `build_model` draws every peer's model from one seed), a model with
    every parameter frozen is refused, and so is a step after one of them was unfrozen. Plain
    tensors are always gossiped, whatever their ``requires_grad``.

    A registered algorithm describes itself with the class attributes below (`registry.register`
    refuses a class that leaves one unset): its spec name, a one-line summary, its spec options,
    where its γ comes from, whether it runs on directed graphs, its legend label, the layout of its
    messages (`layout.MessageLayout`) and, optionally, its config-time checks.
    """

    #: The spec name ("powergossip" in "powergossip:rank=2").
    name = "gossip"
    #: The one hook through which a privacy mechanism puts noise on the messages themselves (ZIP-DL,
    #: `privacy.mechanisms.zipdl`): None, or a callable ``edge_noise(step, neighbors, weights, rows)``
    #: that adds, in place, a different noise to each row of `rows` (the outgoing messages, one row
    #: per neighbour in `neighbors` order, W[i, j] of this step in `weights`) just before they are
    #: sent. Only algorithms with ``supports_edge_noise = True`` call it; each says in its
    #: docstring where the rows come from and which invariant holds.
    supports_edge_noise = False
    edge_noise = None
    #: Whether a noise added to each peer's local update (before its optimizer step and before
    #: anything is sent: Muffliato's, DECOR's pairwise noise) is carried by this algorithm's gossip
    #: of the models so that the mechanisms' accounting holds: True for gossip that mixes the
    #: models themselves and keeps their network sum (DECOR's correlated noise then cancels in it).
    supports_update_noise = False
    #: Whether peers may leave and join a run of this algorithm (`gossip_powersgd.membership`):
    #: at a membership change its state is carried over in two parts, this peer's own
    #: (`node_state`) and what it shares with each neighbour whose edge stays (`edge_state`);
    #: every other edge starts fresh at both ends. False: `on_peer_loss: continue` and `churn`
    #: are refused.
    supports_churn = False
    #: One line for `describe_algorithms()` (the CLI's list).
    summary: Optional[str] = None
    #: Spec key -> `Option` (an empty dict for none).
    options: Optional[Dict[str, Option]] = None
    #: What γ is when the spec sets none: "topology" (the topology's `gamma`; 1 on a schedule),
    #: "tuned" (no good default: sweep it), "none" (the algorithm has no γ).
    gamma_source: Optional[str] = None
    #: True when the algorithm runs on a directed topology (push-sum, the all-reduce baselines).
    directed: Optional[bool] = None
    #: The `layout.MessageLayout` subclass that says what every message holds, for observers.
    layout: Optional[type] = None
    #: "parameters": step() gossips the parameters, after optimizer.step() (D-PSGD order).
    #: "gradients": step() averages p.grad, between backward() and optimizer.step().
    acts_on = "parameters"

    #: The legend label of a spec's options (strings, γ left out), e.g. "PowerGossip r1"; a
    #: classmethod `label(cls, options) -> str` in every registered class.
    label: Optional[Callable[[Dict[str, str]], str]] = None

    @classmethod
    def check_config(cls, kwargs: Dict[str, Any], topology: AnyTopology) -> None:
        """Config-time checks of the spec's parsed options against the run's topology (or
        schedule), run as the config is validated where the topology's size is known and on every
        rank before any collective; raise a one-line ValueError (the config's check puts the key
        and the spec before it). Whether the topology's direction suits the algorithm is checked
        from `directed` already."""

    def __init__(self, params: ParamsLike, comm: Comm):
        who = type(self).__name__
        self.names, self.params, self.frozen = leave_frozen_out(who, *named_tensors(params))
        self.comm = comm
        if not self.params:
            raise ValueError("no parameters given: pass model.parameters() or a list of tensors")
        refuse_repeated_tensors(self.names, self.params)
        dtypes = {t.dtype for t in self.params}
        if len(dtypes) > 1:
            raise ValueError(
                f"parameters have mixed dtypes {sorted(map(str, dtypes))}: convert the model to one "
                "dtype (e.g. model.float()) before gossiping"
            )
        if not self.params[0].is_floating_point():
            raise ValueError(f"parameters must be floating point, got {self.params[0].dtype}")
        devices = {t.device for t in self.params}
        if len(devices) > 1:
            raise ValueError(
                f"parameters live on several devices {sorted(map(str, devices))}: move the model to one"
            )
        self.dtype = self.params[0].dtype
        self.device = self.params[0].device
        self.steps = 0
        # Wall time spent in step() and, within it, waiting on the transport; the rest is the
        # algorithm's own compute.
        self.time_total = 0.0
        self.time_communication = 0.0
        comm.check_agreement("parameter shapes and dtypes", signature(self.names, self.params))
        check_frozen_agree(who, comm, self.frozen)
        self._replaced = ReplacedParameterWatch(self.names, self.params)

    def step(self) -> None:
        """One gossip round on the parameters, in place; refused in one line once a parameter was
        replaced in its module (`ReplacedParameterWatch`)."""
        self._replaced.check(type(self).__name__)
        check_still_frozen(type(self).__name__, self.frozen)
        start = time.perf_counter()
        with torch.no_grad():
            self._step()
        self.steps += 1
        self.time_total += time.perf_counter() - start

    @property
    def time_compute(self) -> float:
        return self.time_total - self.time_communication

    # ---- to be implemented ---------------------------------------------------------------------
    def _step(self) -> None:
        raise NotImplementedError

    def bytes_per_step(self) -> int:
        """Training bytes this peer sends per `step()`, from the algorithm's own formula."""
        raise NotImplementedError

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, object]:
        return {"steps": self.steps}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        self.steps = int(state["steps"])

    # ---- state across a membership change (`supports_churn`) ------------------------------------
    def node_state(self) -> Dict[str, object]:
        """This peer's own state, carried to the algorithm of the next membership epoch. Its
        integers are counters that a joining peer takes from the peers that hand it the state;
        its tensors (an error memory, a push-sum weight) stay this peer's (a joiner's start
        fresh)."""
        return {"steps": self.steps}

    def load_node_state(self, state: Dict[str, object]) -> None:
        self.steps = int(state["steps"])

    def edge_state(self, neighbor: int) -> Optional[Dict[str, object]]:
        """The state this peer shares with `neighbor` (the same at both ends), carried when a
        membership change keeps their edge; None: the edge starts fresh at both ends."""
        return None

    def load_edge_state(self, neighbor: int, state: Dict[str, object]) -> None:
        """Load what `edge_state(neighbor)` returned on the previous epoch's algorithm."""

    # ---- helpers -----------------------------------------------------------------------------------
    def _exchange(
        self,
        send: Dict[int, Tensor],
        recv: Dict[int, Tensor],
        step: Optional[int] = None,
        directed: bool = False,
        outgoing: Optional[Tensor] = None,
        outgoing_sum: Optional[float] = None,
    ) -> None:
        """`comm.exchange` (of `step`'s neighbours, or `comm.exchange_directed` for `directed`),
        refusing to send anything non-finite (a NaN would spread to everyone). `outgoing`, when
        given, is one tensor whose elements are exactly those of all the send buffers (e.g. the
        rows they are views of), checked in one go instead of buffer by buffer; `outgoing_sum` is
        its sum where the caller has computed it."""
        if outgoing is not None:
            if not all_finite(outgoing, outgoing_sum):
                self._raise_non_finite()
        # each distinct buffer once (gossip often sends one buffer to every neighbour)
        elif not all(all_finite(b) for b in {id(b): b for b in send.values()}.values()):
            self._raise_non_finite()
        start = time.perf_counter()
        if directed:
            self.comm.exchange_directed(send, recv, step)
        elif step is None:  # a static topology: the two-argument call every communicator takes
            self.comm.exchange(send, recv)
        else:
            self.comm.exchange(send, recv, step)
        self.time_communication += time.perf_counter() - start

    def _raise_non_finite(self) -> None:
        bad = [n for n, t in zip(self.names, self.params) if not bool(torch.isfinite(t).all())]
        where = f"parameter(s) {', '.join(bad)}" if bad else "the outgoing message (overflow)"
        raise NonFiniteError(
            f"rank {self.comm.rank}: non-finite values in {where} at gossip step {self.steps}; "
            "nothing was sent (lower the learning rate or check the data)"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.comm.rank}, tensors={len(self.params)})"
