"""Time-varying undirected topologies: a schedule gives the gossip graph of every step t.

>>> import topologies
>>> s = topologies.parse("one_peer_exponential:8")   # or topologies.one_peer_exponential(8)
>>> s.period, s.at(0).neighbors(0), s.at(1).neighbors(0)
(3, (1,), (2,))

Every step's W is a validated :class:`~topologies.Topology` built with ``require_connected=False``
(a matching is disconnected); the schedule itself checks that the union of its graphs is
connected, over one period, or for the random schedules over their first :func:`random_window`
steps (`schedule_base.py`: the `Schedule` class they share, re-exported here). Random schedules are
pure functions of ``(seed, t)``, so every peer derives the same graph of step t without
communicating, and ``at(t)`` may be called in any order.
"""

from __future__ import annotations

import math
import re
from functools import cached_property

import numpy as np

from .generators import (
    SCHEDULE_KINDS,
    SPEC_USAGE,
    WHAT,
    _int,
    from_edge_list,
    parse_static,
    split_topology_spec,
)
from .grammar import spec_error
from .schedule_base import (  # noqa: F401 (importable from here, as before)
    WINDOW_PER_PEER,
    Schedule,
    metropolis_on,
    random_window,
)
from .stepcache import CACHE_STEPS, StepCache  # noqa: F401 (importable from here, as before)
from .topology import Topology, check_size
from .weights import weight_matrix

__all__ = [
    "Schedule",
    "OnePeerExponential",
    "RandomMatchings",
    "EdgeSampling",
    "CyclicSchedule",
    "one_peer_exponential",
    "matchings",
    "edge_sampling",
    "cyclic",
    "random_window",
    "product_gap",
    "parse_schedule",
]


def _power_of_two_exponent(n: int, what: str) -> int:
    """log2 n for a power of two n >= 2, else a one-line ValueError."""
    if n < 2 or n & (n - 1):
        raise ValueError(f"{what} needs n to be a power of two >= 2, got n={n}; use e.g. n=16")
    return n.bit_length() - 1


class OnePeerExponential(Schedule):
    """At step t peer i pairs with i XOR 2^(t mod log2 n); n a power of two, weights 1/2.

    The product of W over one period is exactly J/n = 11ᵀ/n: averaging takes log2 n steps.
    """

    def __init__(self, n: int):
        n = check_size(_int(n, "one_peer_exponential size n", 2), f"one_peer_exponential:{n}")
        period = _power_of_two_exponent(n, "one_peer_exponential")
        self._setup(n, f"one_peer_exponential:{n}", period, ("one_peer_exponential", n))
        self._check_union_connected()

    def _step_edges(self, t: int) -> np.ndarray:
        bit = 1 << (t % self._period)
        low = np.flatnonzero((np.arange(self._size) & bit) == 0)
        return np.stack([low, low | bit], axis=1)


class RandomMatchings(Schedule):
    """At every step a uniformly random perfect matching, seeded by ``(seed, t)``; weights 1/2."""

    def __init__(self, n: int, seed: int = 0):
        n = check_size(_int(n, "matchings size n", 2), f"matchings:{n}")
        seed = _int(seed, "matchings seed", 0)
        if n % 2:
            raise ValueError(
                f"matchings needs an even number of peers for perfect matchings, got n={n}"
            )
        name = f"matchings:{n}" + (f":{seed}" if seed else "")
        self._setup(n, name, None, ("matchings", n, seed))
        self._seed = seed
        self._check_union_connected()

    def _step_edges(self, t: int) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence([self._seed, t]))
        return rng.permutation(self._size).reshape(-1, 2)

    def _random_gamma_bound(self) -> float:
        """2, exactly: every step is a perfect matching with weights 1/2, whose I − W has the
        eigenvalues 0 and 1 only."""
        return 2.0

    @cached_property
    def union(self) -> Topology:
        every_pair = ~np.eye(self._size, dtype=bool)
        return Topology(
            weight_matrix(every_pair, "metropolis"),
            name=f"union({self._name})",
            scheme="metropolis",
        )


class EdgeSampling(Schedule):
    """Each edge of a static base graph is active at each step with probability ``p``, seeded.

    A step's W has Metropolis weights on the active edges (isolated peers keep their value).
    """

    def __init__(self, base: Topology, p: float, seed: int = 0):
        if not isinstance(base, Topology):
            raise ValueError(
                f"edge_sampling needs a static base topology, got {type(base).__name__}; "
                f"use e.g. edge_sampling('ring:16', 0.5)"
            )
        try:
            p = float(p)
        except (TypeError, ValueError):
            raise ValueError(f"edge_sampling probability p must be a number, got {p!r}") from None
        if not 0.0 < p <= 1.0:
            raise ValueError(
                f"edge_sampling probability p must be in (0, 1], got {p}; use e.g. 0.5"
            )
        seed = _int(seed, "edge_sampling seed", 0)
        name = f"edge_sampling:{base.name}:{p!r}" + (f":{seed}" if seed else "")
        self._setup(base.size, name, None, ("edge_sampling", base.fingerprint, p, seed))
        self._base = base
        # base.edges() in its order (i < j, row by row), without a Python tuple per edge
        self._base_edges = np.argwhere(np.triu(base.W > 0, k=1)).astype(np.int64).reshape(-1, 2)
        self._p = p
        self._seed = seed
        self._check_union_connected(fix="raise p or use a denser base graph")

    @property
    def base(self) -> Topology:
        """The graph whose edges are sampled."""
        return self._base

    @property
    def p(self) -> float:
        """Probability that an edge is active at a step."""
        return self._p

    def _step_edges(self, t: int) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence([self._seed, t]))
        return self._base_edges[rng.random(len(self._base_edges)) < self._p]

    @cached_property
    def union(self) -> Topology:
        return Topology(
            metropolis_on(self._size, self._base_edges),
            name=f"union({self._name})",
            scheme="metropolis",
        )


class CyclicSchedule(Schedule):
    """A list of topologies used in turn: step t is ``members[t mod len(members)]``, W as given."""

    def __init__(self, members, name: str | None = None):
        members = list(members)
        if not members:
            raise ValueError(
                "cyclic needs at least one topology, e.g. cyclic(['ring:8', 'star:8'])"
            )
        members = [_static(m, "cyclic member") if isinstance(m, str) else m for m in members]
        for m in members:
            if not isinstance(m, Topology):
                raise ValueError(
                    f"cyclic members must be static undirected topologies, got {m!r}; "
                    f"list the graphs of one period instead"
                )
        sizes = sorted({m.size for m in members})
        if len(sizes) > 1:
            raise ValueError(f"cyclic members must have the same size, got sizes {sizes}")
        name = name if name is not None else "cyclic:" + ",".join(m.name for m in members)
        identity = ("cyclic", sizes[0], tuple(m.fingerprint for m in members))
        self._setup(sizes[0], name, len(members), identity)
        self._members = tuple(members)
        self._check_union_connected()

    @property
    def members(self) -> tuple[Topology, ...]:
        """The topologies of one period, in order."""
        return self._members

    def _step_edges(self, t: int) -> np.ndarray:
        return np.array(self._members[t].edges(), dtype=np.int64).reshape(-1, 2)

    def _build(self, t: int) -> Topology:
        return self._members[t]


def one_peer_exponential(n: int) -> OnePeerExponential:
    """The one-peer exponential schedule on n peers (a power of two): i pairs with i XOR 2^(t mod log2 n)."""
    return OnePeerExponential(n)


def matchings(n: int, seed: int = 0) -> RandomMatchings:
    """Random perfect matchings on n peers (n even), a pure function of ``(seed, t)``."""
    return RandomMatchings(n, seed)


def edge_sampling(base, p: float, seed: int = 0) -> EdgeSampling:
    """Each edge of ``base`` (a Topology or static spec) active with probability p at each step."""
    return EdgeSampling(
        _static(base, "edge_sampling base") if isinstance(base, str) else base, p, seed
    )


def cyclic(members, name: str | None = None) -> CyclicSchedule:
    """The schedule that uses ``members`` (Topologies or static specs) in turn, one per step."""
    return CyclicSchedule(members, name)


def product_gap(schedule, steps: int | None = None) -> float:
    """Spectral gap of the product of the mixing matrices of steps 0..steps-1 (default one period).

    Undirected: 1 − ‖W_{k-1}⋯W_0 − J/n‖₂, how much one pass over the steps shrinks the worst
    disagreement (for a static topology and one step, its spectral gap). Directed: 1 − |λ₂| of the
    product of the column-stochastic P's, push-sum's rate. 1.0 means exact averaging.
    """
    if steps is None:
        steps = schedule.period
    if steps is None:
        raise ValueError(f"{schedule.name!r} is random and has no period; give the number of steps")
    steps = _int(steps, "steps", 1)
    n = schedule.size
    if n == 1:
        return 1.0
    product = np.eye(n)
    for t in range(steps):
        step = schedule.at(t)
        product = (step.P if schedule.is_directed else step.W) @ product
    if schedule.is_directed:
        moduli = np.sort(np.abs(np.linalg.eigvals(product)))[::-1]
        return float(1.0 - moduli[1])
    return float(1.0 - np.linalg.norm(product - 1.0 / n, ord=2))


# --- the CLI spelling ----------------------------------------------------------------------------

_WHOLE = re.compile(r"^\d+$")


def _split_sampling(fields: list[str]) -> tuple[list[str], str, str | None]:
    """(base fields, P, SEED) of ``edge_sampling:SPEC:P[:SEED]``.

    The last field is the seed when it is a whole number and the field before it a probability in
    (0, 1]; so ``edge_sampling:ring:16:1`` is p = 1, and ``...:0.5:3`` is p = 0.5, seed 3.
    """
    if len(fields) >= 3 and _WHOLE.match(fields[-1]):
        try:
            probability = float(fields[-2])
        except ValueError:
            probability = math.nan
        if 0.0 < probability <= 1.0:
            return fields[:-2], fields[-2], fields[-1]
    return fields[:-1], fields[-1], None


def _is_schedule_spec(spec: str) -> bool:
    return spec.strip().partition(":")[0].strip().lower().replace("-", "_") in SCHEDULE_KINDS


def _static(spec, what: str, n: int | None = None, weights: str | None = None) -> Topology:
    """The static topology of `spec` (a schedule's member or base); `what` names a schedule's
    spec in the error."""
    if _is_schedule_spec(spec):
        raise ValueError(
            f"{what} {spec.strip()!r} is a schedule; {'list static topologies only' if what.startswith('cyclic') else 'sample the edges of a static topology'}"
        )
    return parse_static(spec, n, weights)


def parse_schedule(spec: str, n: int | None, weights: str | None):
    """The schedule of a spec whose kind is one of ``generators.SCHEDULE_KINDS`` (see ``parse``),
    cut into fields by the one grammar (`generators.split_topology_spec`)."""
    from .directed import directed_exponential, from_directed_edge_list

    parsed = split_topology_spec(spec)
    kind, fields = parsed.name, list(parsed.positional)
    usage = SPEC_USAGE[kind]

    def bad(detail: str) -> ValueError:
        return spec_error(WHAT, spec, f"{detail}; expected {usage!r}")

    def num(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise bad(f"{text!r} is not a valid integer") from None

    def size(text: str | None) -> int:
        if text:
            return num(text)
        if n is None:
            raise bad("the size is missing (give it in the spec, or pass n)")
        return n

    if kind == "cyclic":
        if not fields:
            raise bad("no topologies listed")
        members = [
            # A member file may hold a disconnected graph: only the union must be connected.
            parse_member(m.strip(), n, weights)
            for m in fields
        ]
        return cyclic(members)

    if weights not in (None, "metropolis"):
        raise bad(
            f"its weights are fixed (Metropolis on each step's graph), not {weights!r}; "
            f"drop the weights option"
        )
    if kind == "directed_file":
        if not fields:
            raise bad("missing path")
        return from_directed_edge_list(fields[0])

    if kind in ("one_peer_exponential", "directed_exponential"):
        if len(fields) > 1:
            raise bad("too many fields")
        build = one_peer_exponential if kind == "one_peer_exponential" else directed_exponential
        return build(size(fields[0] if fields else None))
    if kind == "matchings":
        if len(fields) > 2:
            raise bad("too many fields")
        seed = num(fields[1]) if len(fields) == 2 else 0
        return matchings(size(fields[0] if fields else None), seed)

    # edge_sampling
    if len(fields) < 2:
        raise bad("give a base topology and a probability")
    base_fields, p_text, seed_text = _split_sampling(fields)
    try:
        p = float(p_text)
    except ValueError:
        raise bad(f"{p_text!r} is not a valid number") from None
    base_spec = ":".join(base_fields)
    if _is_schedule_spec(base_spec):
        raise bad(f"the base {base_spec!r} is a schedule; sample the edges of a static topology")
    base = parse_static(base_spec, n, None)
    if n is not None and base.size != n:
        raise ValueError(f"topology {base.name!r} has {base.size} nodes but n={n} was asked for")
    return edge_sampling(base, p, num(seed_text) if seed_text is not None else 0)


def parse_member(spec: str, n: int | None, weights: str | None) -> Topology:
    """One member of a ``cyclic:`` spec: a static topology (``file:`` ones may be disconnected)."""
    if spec.lower().startswith("file:"):
        return from_edge_list(spec[5:], weights=weights, require_connected=False)
    member = _static(spec, "cyclic member", n, weights)
    if n is not None and member.size != n:
        raise ValueError(
            f"topology {member.name!r} has {member.size} nodes but n={n} was asked for"
        )
    return member
