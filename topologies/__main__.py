"""``python -m topologies show SPEC [--png FILE] [--weights SCHEME] [-n N]``

Prints a topology's size, edge count, degree range, spectral gap, γ and fingerprint, and with
``--png`` draws it. A bad spec is reported on one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

from .generators import SPEC_USAGE, parse
from .topology import Topology
from .weights import SCHEMES


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
    show.add_argument("spec", help="topology spec, e.g. torus:4x4 or ring:8")
    show.add_argument("-n", type=int, default=None, help="number of nodes (if the spec omits it)")
    show.add_argument("--weights", default=None, help=f"weight scheme: {', '.join(SCHEMES)}")
    show.add_argument("--png", metavar="FILE", default=None, help="also draw the graph to FILE")
    args = parser.parse_args(argv)

    try:
        topo = parse(args.spec, n=args.n, weights=args.weights)
    except (ValueError, TypeError, OSError) as exc:
        # One line, argparse style: these are user errors, a traceback would only hide the message.
        print(f"{show.prog}: error: {exc}", file=sys.stderr)
        return 2
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
