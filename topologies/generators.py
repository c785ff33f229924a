"""Topology generators and the CLI spec parser (on `grammar`); the graph and edge-list importers
are in `importers.py` (re-exported here).

Every generator is a pure function of its arguments (random ones take an integer ``seed``, so that
all ranks build the same graph) and returns a validated :class:`~topologies.Topology` whose
``name`` is the spec string that :func:`parse` turns back into the same topology.
"""

from __future__ import annotations

import math
import operator
import random
import re

import numpy as np

from .topology import MAX_PEERS, Topology, check_connected, check_size
from .grammar import Spec, parse_spec, spec_error, unknown_name
from .importers import from_edge_list, from_graph
from .weights import check_scheme, weight_matrix

__all__ = [
    "ring",
    "torus",
    "grid",
    "complete",
    "star",
    "hypercube",
    "exponential",
    "random_regular",
    "small_world",
    "from_graph",
    "from_edge_list",
    "parse_static",
    "split_topology_spec",
    "SPEC_USAGE",
]


# --- helpers -------------------------------------------------------------------------------------

#: The largest hypercube dimension within MAX_PEERS peers.
HYPERCUBE_MAX_DIM = MAX_PEERS.bit_length() - 1


def _int(value, what: str, minimum: int) -> int:
    """``value`` as an int ≥ ``minimum``, or a ValueError naming ``what``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    return v


def _from_edges(n: int, edges, name: str, weights: str) -> Topology:
    """Topology on nodes 0..n-1 with the given (i, j) edges; self-loops and duplicates collapse."""
    check_scheme(weights)
    check_size(n, name)
    adj = np.zeros((n, n), dtype=bool)
    e = np.asarray(list(edges), dtype=np.int64).reshape(-1, 2)
    adj[e[:, 0], e[:, 1]] = True
    adj[e[:, 1], e[:, 0]] = True
    np.fill_diagonal(adj, False)
    # Connectivity first, so a disconnected graph is reported as such and not as a weighting error.
    check_connected(adj)
    return Topology(weight_matrix(adj, weights), name=name, scheme=weights)


def _dims(dims, what: str) -> tuple[int, ...]:
    # torus((4, 4)) reads naturally too; accept a single sequence argument.
    if len(dims) == 1 and not isinstance(dims[0], (int, np.integer)):
        dims = tuple(dims[0])
    if not dims:
        raise ValueError(f"{what} needs at least one dimension, e.g. {what}(4, 4)")
    return tuple(_int(d, f"{what} dimension", 1) for d in dims)


def _lattice(dims: tuple[int, ...], periodic: bool):
    """Edges of the (periodic) lattice with the given dims; nodes numbered in row-major order."""
    n = math.prod(dims)
    coords = np.indices(dims).reshape(len(dims), n)
    for axis, size in enumerate(dims):
        nxt = coords.copy()
        nxt[axis] += 1
        if periodic:
            nxt[axis] %= size  # size 2: +1 and −1 are the same node; size 1: a self-loop (dropped)
            keep = np.ones(n, dtype=bool)
        else:
            keep = nxt[axis] < size
        src = np.ravel_multi_index(coords[:, keep], dims)
        dst = np.ravel_multi_index(nxt[:, keep], dims)
        yield from zip(src.tolist(), dst.tolist())


# --- generators ----------------------------------------------------------------------------------


def ring(n: int, *, weights: str = "metropolis") -> Topology:
    """Cycle on n nodes: i ~ i ± 1 (mod n). ring(2) is one edge, ring(1) a single node."""
    n = check_size(_int(n, "ring size n", 1), f"ring:{n}")
    return _from_edges(n, _lattice((n,), periodic=True), f"ring:{n}", weights)


def torus(*dims: int, weights: str = "metropolis") -> Topology:
    """Periodic lattice with the given dimensions, e.g. ``torus(4, 4)`` or ``torus(2, 2, 2)``.

    Nodes are numbered in row-major order. A dimension of size 2 contributes one neighbour (the
    node one step "forward" is also the one "backward"), a dimension of size 1 none.
    """
    dims = _dims(dims, "torus")
    check_size(math.prod(dims), "torus:" + "x".join(map(str, dims)))
    return _from_edges(
        math.prod(dims), _lattice(dims, periodic=True), "torus:" + "x".join(map(str, dims)), weights
    )


def grid(*dims: int, weights: str = "metropolis") -> Topology:
    """Non-periodic lattice with the given dimensions, e.g. ``grid(4, 4)``; row-major numbering."""
    dims = _dims(dims, "grid")
    check_size(math.prod(dims), "grid:" + "x".join(map(str, dims)))
    return _from_edges(
        math.prod(dims), _lattice(dims, periodic=False), "grid:" + "x".join(map(str, dims)), weights
    )


def complete(n: int, *, weights: str = "metropolis") -> Topology:
    """Every node linked to every other (with metropolis weights, W = 11ᵀ/n)."""
    n = check_size(_int(n, "complete graph size n", 1), f"complete:{n}")
    edges = [(i, j) for i in range(n) for j in range(i + 1, n)]
    return _from_edges(n, edges, f"complete:{n}", weights)


def star(n: int, *, weights: str = "metropolis") -> Topology:
    """Node 0 linked to nodes 1..n-1."""
    n = check_size(_int(n, "star size n", 1), f"star:{n}")
    return _from_edges(n, [(0, i) for i in range(1, n)], f"star:{n}", weights)


def hypercube(dim: int, *, weights: str = "metropolis") -> Topology:
    """The dim-dimensional hypercube on 2**dim nodes: i ~ i XOR 2**b."""
    dim = _int(dim, "hypercube dimension", 0)
    # before the edge list of 2**dim nodes exists, and before 2**dim itself for a huge dim
    if dim > HYPERCUBE_MAX_DIM:
        raise ValueError(
            f"hypercube:{dim} has 2^{dim} peers, above the maximum of {MAX_PEERS}; use a "
            f"dimension of at most {HYPERCUBE_MAX_DIM}"
        )
    n = check_size(1 << dim, f"hypercube:{dim}")
    edges = [(i, i ^ (1 << b)) for i in range(n) for b in range(dim)]
    return _from_edges(n, edges, f"hypercube:{dim}", weights)


def exponential(n: int, *, weights: str = "metropolis") -> Topology:
    """Undirected exponential graph: i ~ i ± 2**k (mod n) for every 2**k < n."""
    n = check_size(_int(n, "exponential graph size n", 1), f"exponential:{n}")
    offsets = [1 << k for k in range(max(n - 1, 1).bit_length()) if (1 << k) < n]
    edges = [(i, (i + off) % n) for i in range(n) for off in offsets]
    return _from_edges(n, edges, f"exponential:{n}", weights)


def random_regular(n: int, d: int, seed: int = 0, *, weights: str = "metropolis") -> Topology:
    """A connected random d-regular graph on n nodes (networkx ``random_regular_graph``).

    If the draw for ``seed`` is disconnected, further draws from the same seeded stream are tried,
    so the result is still a deterministic function of (n, d, seed).
    """
    n = check_size(_int(n, "random_regular size n", 1), f"random_regular:{n}")
    d = _int(d, "random_regular degree d", 0)
    seed = _int(seed, "random_regular seed", 0)
    if d >= n and not (n == 1 and d == 0):
        raise ValueError(f"random_regular degree d must be < n, got d={d}, n={n}")
    if (n * d) % 2:
        raise ValueError(f"random_regular needs n*d even, got n={n}, d={d}")
    if (d == 0 and n > 1) or (d == 1 and n > 2):
        raise ValueError(f"a {d}-regular graph on {n} nodes is never connected; use d >= 2")
    name = f"random_regular:{n}:{d}" + (f":{seed}" if seed else "")
    import networkx as nx

    rng = random.Random(seed)  # same first draw as seed=seed; retries continue the stream
    for _ in range(100):
        g = nx.random_regular_graph(d, n, seed=rng)
        if nx.is_connected(g):
            return from_graph(g, weights=weights, name=name)
    raise ValueError(
        f"no connected {d}-regular graph on {n} nodes found in 100 draws; use a larger d"
    )


def small_world(
    n: int, k: int, p: float, seed: int = 0, *, weights: str = "metropolis"
) -> Topology:
    """Connected Watts–Strogatz small-world graph (networkx ``connected_watts_strogatz_graph``).

    Each node starts linked to its k nearest ring neighbours (k // 2 on each side), then each edge
    is rewired with probability p.
    """
    n = check_size(_int(n, "small_world size n", 1), f"small_world:{n}")
    k = _int(k, "small_world neighbour count k", 0)
    seed = _int(seed, "small_world seed", 0)
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise ValueError(
            f"small_world rewiring probability p must be a number, got {p!r}"
        ) from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"small_world rewiring probability p must be in [0, 1], got {p}")
    if k > n:
        raise ValueError(f"small_world needs k <= n, got k={k}, n={n}")
    name = f"small_world:{n}:{k}:{p!r}" + (f":{seed}" if seed else "")
    import networkx as nx

    try:
        g = nx.connected_watts_strogatz_graph(n, k, p, tries=100, seed=seed)
    except nx.NetworkXError as exc:
        raise ValueError(f"small_world({n}, {k}, {p}): {exc}") from None
    return from_graph(g, weights=weights, name=name)


# --- the CLI spelling ----------------------------------------------------------------------------

#: How each topology is spelled in a spec string (``N`` may be left out when ``parse`` gets ``n``).
SPEC_USAGE: dict[str, str] = {
    "ring": "ring:N",
    "torus": "torus:AxB[xC...]",
    "grid": "grid:AxB[xC...]",
    "complete": "complete:N",
    "star": "star:N",
    "hypercube": "hypercube:DIM",
    "exponential": "exponential:N",
    "random_regular": "random_regular:N:D[:SEED]",
    "small_world": "small_world:N:K:P[:SEED]",
    "file": "file:PATH",
    # Schedules: a different graph at every step (topologies.schedules, topologies.directed).
    "one_peer_exponential": "one_peer_exponential:N",
    "matchings": "matchings:N[:SEED]",
    "edge_sampling": "edge_sampling:SPEC:P[:SEED]",
    "cyclic": "cyclic:SPEC,SPEC[,...]",
    "directed_exponential": "directed_exponential:N",
    "directed_file": "directed_file:PATH",
}


#: The spellings in SPEC_USAGE that :mod:`topologies.schedules` parses.
SCHEDULE_KINDS = (
    "one_peer_exponential",
    "matchings",
    "edge_sampling",
    "cyclic",
    "directed_exponential",
    "directed_file",
)


def _squarest(n: int) -> tuple[int, int]:
    """The 2-D factorisation a×b = n with a ≤ b and a as large as possible (16 → 4×4, 8 → 2×4)."""
    a = math.isqrt(n)
    while n % a:
        a -= 1
    return a, n // a


#: How topology specs are named in errors (`grammar.spec_error`: ``topology spec '<spec>': ...``).
WHAT = "topology spec"

#: Kinds whose whole text after the colon is one field, a path (which may hold ':' or ',').
PATH_KINDS = ("file", "directed_file")


def split_topology_spec(spec) -> Spec:
    """`spec` cut by the one grammar (`topologies.grammar`): the kind (lower-cased, '-' read as
    '_') and its positional fields, separated by ':' (``small_world:16:4:0.2``; a cyclic spec's
    members by ','; a field in square brackets may hold either). A path kind's whole rest is one
    field. An unknown kind and any ``key=value`` option are refused in the grammar's one style."""
    if not isinstance(spec, str):
        raise TypeError(f"topology spec must be a string, got {type(spec).__name__}")
    head, _, rest = spec.strip().partition(":")
    kind = head.strip().lower().replace("-", "_")
    if kind not in SPEC_USAGE:
        raise unknown_name(WHAT, spec, kind, SPEC_USAGE)
    if kind in PATH_KINDS:
        return Spec(kind, (rest,) if rest else ())
    parsed = parse_spec(spec, WHAT, separator="," if kind == "cyclic" else ":", imports=False)
    for key in parsed.options:
        raise spec_error(
            WHAT,
            spec,
            f"unknown option {key!r}; valid: none (its fields are positional: "
            f"{SPEC_USAGE[kind]!r})",
        )
    return Spec(kind, parsed.positional)


def parse_static(spec, n: int | None = None, weights: str | None = None) -> Topology:
    """The static topology of ``spec`` (`topologies.parse` without schedules; a schedule's spec is
    handed to ``schedules.parse_schedule`` by ``parse``, which builds on this)."""
    parsed = split_topology_spec(spec)
    if n is not None:
        n = _int(n, "n", 1)
    kind, args = parsed.name, list(parsed.positional)
    usage = SPEC_USAGE[kind]
    if kind in SCHEDULE_KINDS:
        raise spec_error(WHAT, spec, "it is a schedule; parse it with topologies.parse")

    def bad(detail: str) -> ValueError:
        return spec_error(WHAT, spec, f"{detail}; expected {usage!r}")

    if kind == "file":
        if not args:
            raise bad("missing path")
        return from_edge_list(args[0], weights=weights)

    w = {"weights": weights if weights is not None else "metropolis"}

    def num(text: str, conv=int):
        try:
            return conv(text)
        except ValueError:
            raise bad(f"{text!r} is not a valid {'integer' if conv is int else 'number'}") from None

    def need_n() -> int:
        if n is None:
            raise bad("the size is missing (give it in the spec, or pass n)")
        return n

    if kind in ("ring", "complete", "star", "exponential"):
        if len(args) > 1:
            raise bad("too many fields")
        size = num(args[0]) if args else need_n()
        return {"ring": ring, "complete": complete, "star": star, "exponential": exponential}[kind](
            size, **w
        )

    if kind in ("torus", "grid"):
        if len(args) > 1:
            raise bad("too many fields")
        if args:
            dims = tuple(num(d) for d in re.split(r"[xX]", args[0]))
        else:
            dims = _squarest(need_n())
        return (torus if kind == "torus" else grid)(*dims, **w)

    if kind == "hypercube":
        if len(args) > 1:
            raise bad("too many fields")
        if args:
            return hypercube(num(args[0]), **w)
        size = need_n()
        if size & (size - 1):
            raise bad(f"n={size} is not a power of two")
        return hypercube(size.bit_length() - 1, **w)

    if kind == "random_regular":
        if len(args) == 1:
            return random_regular(need_n(), num(args[0]), **w)
        if len(args) in (2, 3):
            return random_regular(*(num(a) for a in args), **w)
        raise bad("wrong number of fields")

    # small_world
    if len(args) == 2:
        return small_world(need_n(), num(args[0]), num(args[1], float), **w)
    if len(args) in (3, 4):
        extra = [num(args[3])] if len(args) == 4 else []
        return small_world(num(args[0]), num(args[1]), num(args[2], float), *extra, **w)
    raise bad("wrong number of fields")
