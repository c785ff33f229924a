"""`parse`: a topology or schedule from its spelling (``"ring:8"``, ``"matchings:8:3"``).

Every spelling is cut into fields by the one spec grammar (`grammar`, through
`generators.split_topology_spec`). Static spellings are built by `generators.parse_static`,
time-varying ones by `schedules.parse_schedule` (which builds directed ones with `directed.py`);
this module sits above the three, so none of them imports another in a circle.
"""

from __future__ import annotations

from typing import Union

from .directed import DirectedSchedule, DirectedTopology
from .generators import SCHEDULE_KINDS, SPEC_USAGE, _int, parse_static
from .schedules import Schedule, parse_schedule
from .topology import Topology

__all__ = ["parse", "SPEC_USAGE", "AnyTopology"]

#: What `parse` returns, and what a ``topology`` argument may be: a static graph, a schedule, or
#: their directed versions (check ``is_directed`` and ``is_static`` before relying on either).
AnyTopology = Union[Topology, Schedule, DirectedTopology, DirectedSchedule]


def _kind(spec: str) -> str:
    return spec.strip().partition(":")[0].strip().lower().replace("-", "_")


def parse(spec, n: int | None = None, weights: str | None = None) -> AnyTopology:
    """Build a topology or schedule from its CLI spelling, e.g. ``"torus:4x4"``, ``parse("ring", n=8)``.

    Spellings: see :data:`SPEC_USAGE`. When ``n`` is given the size may be left out of the spec
    (``"ring"``, ``"torus"`` → the squarest 2-D torus, ``"hypercube"``, ``"random_regular:D"``,
    ``"small_world:K:P"``), and a spec that does include a size must agree with it. ``weights``
    defaults to ``"metropolis"`` (for ``file:`` specs, to the file's own weights if it has them).
    A ``Topology`` passed as ``spec`` is returned as is (after the size check).
    Unknown names and malformed specs raise ``ValueError``.

    Static spellings give a :class:`Topology`; ``one_peer_exponential``, ``matchings``,
    ``edge_sampling`` and ``cyclic`` give a :class:`~topologies.Schedule`, ``directed_exponential``
    a :class:`~topologies.DirectedSchedule` and ``directed_file`` a
    :class:`~topologies.DirectedTopology` (check ``is_directed`` before using the result).
    """
    if isinstance(spec, (Topology, Schedule, DirectedTopology, DirectedSchedule)):
        topo = spec
    elif isinstance(spec, str) and _kind(spec) in SCHEDULE_KINDS:
        if n is not None:
            n = _int(n, "n", 1)
        topo = parse_schedule(spec, n, weights)
    else:
        topo = parse_static(spec, n, weights)
    if n is not None and topo.size != n:
        raise ValueError(f"topology {topo.name!r} has {topo.size} nodes but n={n} was asked for")
    return topo
