"""Gossip topologies: graphs, mixing weights and spectral diagnostics (numpy + networkx, no torch).

>>> import topologies
>>> t = topologies.parse("torus:4x4")          # or topologies.torus(4, 4)
>>> t.size, t.neighbors(0)
(16, (1, 3, 4, 12))
>>> round(topologies.ring(8).gamma, 3)
1.308

Schedules give a different graph at every step (``s.at(t)``), for time-varying gossip:

>>> s = topologies.parse("one_peer_exponential:16")
>>> s.period, s.at(1).neighbors(0)
(4, (2,))

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
    random_regular,
    ring,
    small_world,
    star,
    torus,
)
from .directed import (
    DirectedSchedule,
    DirectedTopology,
    directed_exponential,
    from_directed_edge_list,
    validate_column_stochastic,
)
from .schedules import (
    Schedule,
    cyclic,
    edge_sampling,
    matchings,
    one_peer_exponential,
    product_gap,
)
from .repair import Repaired, repair
from .spec import AnyTopology, parse
from .topology import MAX_PEERS, Topology, validate_mixing_matrix
from .weights import SCHEMES, weight_matrix

__all__ = [
    "AnyTopology",
    "Topology",
    "Schedule",
    "Repaired",
    "DirectedTopology",
    "DirectedSchedule",
    "MAX_PEERS",
    "SCHEMES",
    "SPEC_USAGE",
    "complete",
    "cyclic",
    "directed_exponential",
    "edge_sampling",
    "exponential",
    "from_directed_edge_list",
    "from_edge_list",
    "from_graph",
    "grid",
    "hypercube",
    "matchings",
    "one_peer_exponential",
    "parse",
    "product_gap",
    "random_regular",
    "repair",
    "ring",
    "small_world",
    "star",
    "torus",
    "validate_column_stochastic",
    "validate_mixing_matrix",
    "weight_matrix",
]
