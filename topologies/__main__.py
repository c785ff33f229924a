"""``python -m topologies show SPEC [--png FILE] [--weights SCHEME] [-n N]``

Prints a topology's size, edge count, degree range, spectral gap, γ and fingerprint, and with
``--png`` draws it. For a schedule it prints the period, the union graph, the degrees of each
step (one period, or the first ``--steps`` of a random schedule) and the spectral gap of the
product of the mixing matrices over those steps; ``--png`` draws the union graph.
A bad spec is reported on one line on stderr with exit status 2.

The work is bounded before it starts, so that ``show`` answers in seconds at any size it accepts:
the counts come from the degrees (never a list of every edge), a schedule's steps from their edge
arrays, and the product gap, which multiplies dense n×n matrices, is computed only within
:data:`PRODUCT_GAP_WORK` (otherwise its row says why and what to pass instead). ``--steps`` is at
most :data:`MAX_STEPS` and ``--png`` draws at most :data:`PNG_MAX_EDGES` edges.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np

from .generators import SPEC_USAGE
from .spec import parse
from .directed import DirectedSchedule
from .schedules import CyclicSchedule, Schedule, product_gap
from .topology import Topology
from .weights import SCHEMES

#: At most this many steps are listed one per line by ``show``.
STEPS_LISTED = 16
#: The largest ``--steps``: the product gap builds every step's graph and multiplies it in, and the
#: statistics of a random schedule settle long before (10000 steps of a small graph: seconds).
MAX_STEPS = 10_000
#: The product gap costs about (steps + PRODUCT_GAP_DECOMPOSITION) dense n×n products (n³
#: multiply-adds each: the steps, then the singular values or eigenvalues of the product); it is
#: computed when that is at most this many multiply-adds: 8 steps at 2048 peers, about 150 at 1024.
PRODUCT_GAP_WORK = 18 * 2048**3
PRODUCT_GAP_DECOMPOSITION = 10
#: ``--png`` draws at most this many edges (matplotlib draws each one as a Python object).
PNG_MAX_EDGES = 20_000


def summary(topo: Topology) -> str:
    """The text ``show`` prints: one ``key  value`` line per property."""
    lo, hi = min(topo.degrees), max(topo.degrees)
    rows = [
        ("topology", topo.name),
        ("size", topo.size),
        ("edges", sum(topo.degrees) // 2),
        ("degrees", f"{lo}" if lo == hi else f"{lo}..{hi}"),
        ("weights", topo.scheme),
        ("spectral gap", f"{topo.spectral_gap:.6g}"),
        ("gamma", f"{topo.gamma:.6g}"),
        ("fingerprint", topo.fingerprint),
    ]
    return "\n".join(f"{k:<13}{v}" for k, v in rows)


def _degree_range(degrees) -> str:
    lo, hi = min(degrees), max(degrees)
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def _step_counts(schedule, t: int) -> tuple[int, tuple[int, ...]]:
    """(edge count, degrees; out-degrees when directed) of step ``t``, from the step's edge array
    where the schedule has one, so that the step's dense n×n W (or P) is never built here."""
    n, directed = schedule.size, schedule.is_directed
    if isinstance(schedule, DirectedSchedule):
        edges = schedule._edges[t % schedule.period]
    elif isinstance(schedule, Schedule) and not isinstance(schedule, CyclicSchedule):
        edges = schedule._step_edges(t % schedule.period if schedule.period else t)
    else:  # a cyclic schedule's members, or a static directed graph: already built
        step = schedule.at(t)
        degrees = step.out_degrees if directed else step.degrees
        return (sum(degrees) if directed else sum(degrees) // 2), degrees
    # Each edge once, as the step's graph has it: no self-loops, (i, j) = (j, i) when undirected.
    edges = edges[edges[:, 0] != edges[:, 1]]
    if not directed:
        edges = np.sort(edges, axis=1)
    src, dst = np.divmod(np.unique(edges[:, 0] * n + edges[:, 1]), n)
    degrees = np.bincount(src, minlength=n) + (0 if directed else np.bincount(dst, minlength=n))
    return len(src), tuple(degrees.tolist())


def product_gap_row(schedule, span: int) -> str:
    """The product gap over ``span`` steps, or, above PRODUCT_GAP_WORK, why it is not computed."""
    n = schedule.size
    work = (span + PRODUCT_GAP_DECOMPOSITION) * n**3
    if work > PRODUCT_GAP_WORK:
        fewer = PRODUCT_GAP_WORK // n**3 - PRODUCT_GAP_DECOMPOSITION
        fix = (
            f"pass --steps {fewer} or fewer"
            if fewer >= 1 and not schedule.period
            else "use fewer peers to see it"
        )
        return (
            f"not computed: {span} dense {n}x{n} products and a decomposition, ~{work:.2g} "
            f"multiply-adds, above show's {PRODUCT_GAP_WORK:.2g}; {fix}"
        )
    # repr of the rounded value, so that exact averaging reads 1.0 (not 1, which looks like a count)
    return repr(round(product_gap(schedule, span), 6))


def schedule_summary(schedule, steps: int = 8) -> str:
    """The text ``show`` prints for a schedule or a directed graph.

    ``steps`` is how many steps a random schedule (no period) is described over; a periodic one
    is described over its period.
    """
    directed = schedule.is_directed
    span = schedule.period or steps
    union = schedule.union
    union_degrees = union.out_degrees if directed else union.degrees
    kind = "out-degrees" if directed else "degrees"

    rows = [
        ("schedule", schedule.name),
        ("size", schedule.size),
        ("directed", "yes (push-sum, column-stochastic)" if directed else "no"),
        ("period", schedule.period if schedule.period else "none (random)"),
        ("union edges", sum(union_degrees) if directed else sum(union_degrees) // 2),
        ("union " + kind, _degree_range(union_degrees)),
    ]
    for t in range(min(span, STEPS_LISTED)):
        count, degrees = _step_counts(schedule, t)
        rows.append((f"step {t}", f"{count} edges, {kind} {_degree_range(degrees)}"))
    if span > STEPS_LISTED:
        rows.append(("...", f"{span - STEPS_LISTED} more steps"))
    over = "one period" if schedule.period else f"steps 0..{span - 1}"
    rows.append((f"product gap ({over})", product_gap_row(schedule, span)))
    rows.append(("fingerprint", schedule.fingerprint))
    width = max(13, max(len(k) for k, _ in rows) + 2)
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def _layout(topo: Topology):
    import networkx as nx

    kind = topo.name.partition(":")[0]
    dims = topo.name.partition(":")[2].split("x")
    if kind in ("torus", "grid") and len(dims) == 2:
        # Draw 2-D lattices as lattices; node index is row-major, so (row, col) = divmod(i, cols).
        cols = int(dims[1])
        return {i: (i % cols, -(i // cols)) for i in range(topo.size)}
    if kind in ("ring", "exponential", "complete", "small_world", "random_regular", "star"):
        return nx.circular_layout(topo.graph)
    return nx.spring_layout(topo.graph, seed=0)


def draw_png(topo: Topology, path: str) -> None:
    """Draw ``topo`` to the PNG file ``path``, atomically (a partial file never appears there)."""
    # Imported here so that plain `show` (and `import topologies`) never pays for matplotlib.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    g = topo.graph
    size = max(4.0, min(12.0, 1.5 * math.sqrt(topo.size)))
    fig, ax = plt.subplots(figsize=(size, size))
    try:
        pos = _layout(topo)
        wmax = max((d["weight"] for *_, d in g.edges(data=True)), default=1.0)
        widths = [0.5 + 2.5 * d["weight"] / wmax for *_, d in g.edges(data=True)]
        edges = list(g.edges())
        # On a drawn torus the wrap-around edges would run straight through the lattice and hide;
        # bend every edge that is longer than one lattice step.
        long = [
            abs(pos[u][0] - pos[v][0]) + abs(pos[u][1] - pos[v][1]) > 1.5
            if topo.name.startswith("torus:")
            else False
            for u, v in edges
        ]
        node_size = 300 if topo.size <= 64 else 30
        nx.draw_networkx_nodes(g, pos, ax=ax, node_color="#9ecae1", node_size=node_size)
        if topo.size <= 64:
            nx.draw_networkx_labels(g, pos, ax=ax, font_size=8)
        for bend in (False, True):
            sel = [k for k, lg in enumerate(long) if lg == bend]
            if not sel:
                continue
            extra = {"arrows": True, "arrowstyle": "-", "connectionstyle": "arc3,rad=0.25"}
            nx.draw_networkx_edges(
                g,
                pos,
                ax=ax,
                edgelist=[edges[k] for k in sel],
                width=[widths[k] for k in sel],
                edge_color="#555555",
                node_size=node_size,
                **(extra if bend else {}),
            )
        ax.set_title(
            f"{topo.name}  (n={topo.size}, gap={topo.spectral_gap:.4g}, gamma={topo.gamma:.4g})"
        )
        ax.set_axis_off()
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".topology-", suffix=".png", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fig.savefig(fh, format="png", dpi=100, bbox_inches="tight")
            # mkstemp creates the file 0600; give it the mode a plain open() would have.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    finally:
        plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m topologies``."""
    parser = argparse.ArgumentParser(
        prog="python -m topologies", description="Inspect gossip topologies."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser(
        "show",
        help="print size, degrees, spectral gap, gamma and fingerprint of a topology",
        epilog="specs: " + ", ".join(SPEC_USAGE.values()),
    )
    show.add_argument(
        "spec", help="topology or schedule spec, e.g. torus:4x4 or one_peer_exponential:16"
    )
    show.add_argument("-n", type=int, default=None, help="number of nodes (if the spec omits it)")
    show.add_argument("--weights", default=None, help=f"weight scheme: {', '.join(SCHEMES)}")
    show.add_argument(
        "--png",
        metavar="FILE",
        default=None,
        help="also draw the graph (of a schedule: its union graph) to FILE",
    )
    show.add_argument(
        "--steps",
        type=int,
        default=8,
        help="steps described for a random schedule, which has no period (default 8, "
        f"at most {MAX_STEPS})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m topologies``; returns the exit status."""
    parser = build_parser()
    show_prog = f"{parser.prog} show"  # how its errors start, as argparse's own
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= MAX_STEPS:
        print(
            f"{show_prog}: error: --steps must be in 1..{MAX_STEPS}, got {args.steps} (every step's "
            "graph is built and multiplied into the product gap, and a random schedule's "
            "statistics settle long before); use e.g. --steps 64",
            file=sys.stderr,
        )
        return 2

    try:
        topo = parse(args.spec, n=args.n, weights=args.weights)
    except (ValueError, TypeError, OSError) as exc:
        # One line, argparse style: these are user errors, a traceback would only hide the message.
        print(f"{show_prog}: error: {exc}", file=sys.stderr)
        return 2
    if not isinstance(topo, Topology):
        if args.png and topo.is_directed:
            print(
                f"{show_prog}: error: --png draws undirected graphs only; {topo.name!r} is directed",
                file=sys.stderr,
            )
            return 2
        drawn = topo.union  # what --png draws
    else:
        drawn = topo
    if args.png and sum(drawn.degrees) // 2 > PNG_MAX_EDGES:
        print(
            f"{show_prog}: error: --png draws at most {PNG_MAX_EDGES} edges and {drawn.name!r} has "
            f"{sum(drawn.degrees) // 2} (each is drawn as a Python object: minutes); drop --png "
            "or draw a smaller graph",
            file=sys.stderr,
        )
        return 2
    print(summary(topo) if isinstance(topo, Topology) else schedule_summary(topo, args.steps))
    if args.png:
        try:
            draw_png(drawn, args.png)
        except OSError as exc:
            print(f"{show_prog}: error: cannot write {args.png}: {exc}", file=sys.stderr)
            return 1
        print(f"{'png':<13}{args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
