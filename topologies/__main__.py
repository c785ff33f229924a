"""``python -m topologies show SPEC [--png FILE] [--weights SCHEME] [-n N]``

Prints a topology's size, edge count, degree range, spectral gap, γ and fingerprint, and with
``--png`` draws it. For a schedule it prints the period, the union graph, the degrees of each
step (one period, or the first ``--steps`` of a random schedule) and the spectral gap of the
product of the mixing matrices over those steps; ``--png`` draws the union graph.
A bad spec is reported on one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

from .generators import SPEC_USAGE, parse
from .schedules import product_gap
from .topology import Topology
from .weights import SCHEMES

#: At most this many steps are listed one per line by ``show``.
STEPS_LISTED = 16


def summary(topo: Topology) -> str:
    """The text ``show`` prints: one ``key  value`` line per property."""
    lo, hi = min(topo.degrees), max(topo.degrees)
    rows = [
        ("topology", topo.name),
        ("size", topo.size),
        ("edges", len(topo.edges())),
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


def schedule_summary(schedule, steps: int = 8) -> str:
    """The text ``show`` prints for a schedule or a directed graph.

    ``steps`` is how many steps a random schedule (no period) is described over; a periodic one
    is described over its period.
    """
    directed = schedule.is_directed
    span = schedule.period or steps
    union = schedule.union

    def degrees(graph):
        return graph.out_degrees if directed else graph.degrees

    rows = [
        ("schedule", schedule.name),
        ("size", schedule.size),
        ("directed", "yes (push-sum, column-stochastic)" if directed else "no"),
        ("period", schedule.period if schedule.period else "none (random)"),
        ("union edges", len(union.edges())),
        ("union " + ("out-degrees" if directed else "degrees"), _degree_range(degrees(union))),
    ]
    for t in range(min(span, STEPS_LISTED)):
        step = schedule.at(t)
        kind = "out-degrees" if directed else "degrees"
        rows.append((f"step {t}", f"{len(step.edges())} edges, {kind} {_degree_range(degrees(step))}"))
    if span > STEPS_LISTED:
        rows.append(("...", f"{span - STEPS_LISTED} more steps"))
    over = "one period" if schedule.period else f"steps 0..{span - 1}"
    # repr of the rounded value, so that exact averaging reads 1.0 (not 1, which looks like a count)
    rows.append((f"product gap ({over})", repr(round(product_gap(schedule, span), 6))))
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
            if topo.name.startswith("torus:") else False
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
                g, pos, ax=ax, edgelist=[edges[k] for k in sel], width=[widths[k] for k in sel],
                edge_color="#555555", node_size=node_size, **(extra if bend else {}),
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m topologies``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m topologies", description="Inspect gossip topologies."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser(
        "show",
        help="print size, degrees, spectral gap, gamma and fingerprint of a topology",
        epilog="specs: " + ", ".join(SPEC_USAGE.values()),
    )
    show.add_argument("spec", help="topology or schedule spec, e.g. torus:4x4 or one_peer_exponential:16")
    show.add_argument("-n", type=int, default=None, help="number of nodes (if the spec omits it)")
    show.add_argument("--weights", default=None, help=f"weight scheme: {', '.join(SCHEMES)}")
    show.add_argument("--png", metavar="FILE", default=None,
                      help="also draw the graph (of a schedule: its union graph) to FILE")
    show.add_argument("--steps", type=int, default=8,
                      help="steps described for a random schedule, which has no period (default 8)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        print(f"{show.prog}: error: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2

    try:
        topo = parse(args.spec, n=args.n, weights=args.weights)
    except (ValueError, TypeError, OSError) as exc:
        # One line, argparse style: these are user errors, a traceback would only hide the message.
        print(f"{show.prog}: error: {exc}", file=sys.stderr)
        return 2
    if not isinstance(topo, Topology):
        if args.png and topo.is_directed:
            print(f"{show.prog}: error: --png draws undirected graphs only; {topo.name!r} is directed",
                  file=sys.stderr)
            return 2
        print(schedule_summary(topo, args.steps))
        topo = topo.union  # what --png draws
    else:
        print(summary(topo))
    if args.png:
        try:
            draw_png(topo, args.png)
        except OSError as exc:
            print(f"{show.prog}: error: cannot write {args.png}: {exc}", file=sys.stderr)
            return 1
        print(f"{'png':<13}{args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
