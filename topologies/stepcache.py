"""`StepCache`: the machinery every time-varying topology shares (undirected schedules in
`schedules.py`, directed ones in `directed.py`): step checks, a small cache of built steps, the
fingerprint."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from functools import cached_property

from .topology import step_index

__all__ = ["StepCache", "CACHE_STEPS"]

#: How many recently built steps a schedule keeps (a dense n×n W each).
CACHE_STEPS = 8


class StepCache:
    """The machinery every schedule shares: step checks, a small cache, the fingerprint.

    Subclasses set ``_size``, ``_name``, ``_period`` and ``_identity`` (a tuple of plain values
    that determines the schedule) through :meth:`_setup`, and implement ``_build(t)`` for a step
    already reduced modulo the period.
    """

    _TAG = b"topologies.Schedule/v1\0"

    def _setup(self, size: int, name: str, period: int | None, identity: tuple) -> None:
        self._size = size
        self._name = name
        self._period = period
        self._identity = identity
        self._cache: OrderedDict = OrderedDict()
        # Peers of a local cluster are threads sharing one schedule object.
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """Number of peers n."""
        return self._size

    @property
    def name(self) -> str:
        """The spec string that :func:`topologies.parse` turns back into this schedule."""
        return self._name

    @property
    def period(self) -> int | None:
        """Steps after which the graphs repeat, or None for a random schedule."""
        return self._period

    def at(self, t: int):
        """The graph of step ``t`` (any t >= 0, in any order)."""
        t = step_index(t)
        key = t % self._period if self._period else t
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        step = self._build(key)
        with self._lock:
            self._cache[key] = step
            while len(self._cache) > CACHE_STEPS:
                self._cache.popitem(last=False)
        return step

    def _build(self, t: int):
        raise NotImplementedError

    def neighbors_union(self, i: int) -> tuple[int, ...]:
        """Peers that ``i`` exchanges with at some step: its neighbours in :attr:`union`."""
        return self.union.neighbors(i)

    @cached_property
    def fingerprint(self) -> str:
        """A stable sha256 hex digest of the schedule's kind, size and parameters.

        Distinct from every static topology's fingerprint (another prefix is hashed), and the same
        on every peer, for cross-rank agreement checks.
        """
        h = hashlib.sha256(self._TAG)
        h.update(repr(self._identity).encode())
        return h.hexdigest()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._name == other._name and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash((self._name, self.fingerprint))

    def __repr__(self) -> str:
        period = self._period if self._period else "random"
        return f"{type(self).__name__}({self._name!r}, size={self._size}, period={period})"
