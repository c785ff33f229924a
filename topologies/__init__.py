"""Gossip topologies: graphs, mixing weights and spectral diagnostics (numpy + networkx, no torch).

>>> import topologies
>>> t = topologies.parse("torus:4x4")          # or topologies.torus(4, 4)
>>> t.size, t.neighbors(0)
(16, (1, 3, 4, 12))
>>> round(topologies.ring(8).gamma, 3)
1.308

See ``python -m topologies show SPEC`` for a summary (and a drawing) of any spec.
"""

from .generators import (
    SPEC_USAGE,
    complete,
    exponential,
    from_edge_list,
    from_graph,
    grid,
    hypercube,
    parse,
    random_regular,
    ring,
    small_world,
    star,
    torus,
)
from .topology import MAX_PEERS, Topology, validate_mixing_matrix
from .weights import SCHEMES, weight_matrix

__all__ = [
    "Topology",
    "MAX_PEERS",
    "SCHEMES",
    "SPEC_USAGE",
    "complete",
    "exponential",
    "from_edge_list",
    "from_graph",
    "grid",
    "hypercube",
    "parse",
    "random_regular",
    "ring",
    "small_world",
    "star",
    "torus",
    "validate_mixing_matrix",
    "weight_matrix",
]
