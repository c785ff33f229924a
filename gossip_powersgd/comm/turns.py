"""Turn-taking for the in-process cluster's peer threads (`LocalCluster(..., cooperative=...)`).

A schedule and nothing more: which peer thread runs, never what it computes or sends.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from typing import Callable, Dict, List, Optional

from .base import Tensor

#: How often a peer waiting for its turn checks for an abort or its deadline.
_TURN_POLL_SECONDS = 0.25


class _Waiter:
    """A peer thread waiting to run: its gate opens when it is granted the turn (or on an abort)."""

    __slots__ = ("gate", "granted", "key", "lane", "ready_since")

    def __init__(self, lane: int, key=None):
        self.lane = lane  # whose turn it waits for
        self.gate = threading.Lock()
        self.gate.acquire()
        self.granted = False
        self.key = key  # the mailbox it waits on, while it waits for a message
        self.ready_since: Optional[float] = None  # when it became able to run


class Turns:
    """Lets one peer thread per lane run at a time, in dataflow order: whenever the running peer would wait
    (for a message or a collective), the turn goes to a peer able to run (its message has arrived,
    or its collective is over), the one that became able last: its data are the likeliest to be
    still in cache. That cannot starve anyone for long: a peer gets at most one step ahead of its
    neighbours before it waits for them, and patience (below) bounds any wait for the turn.

    With one thread per peer and many more peers than cores, free-running threads spend most of a
    gossip step handing the GIL around: PyTorch releases it around every tensor operation, so each
    small operation of one peer lets another peer in, and every such hand-over is a context switch
    (64 peers of a ResNet-20: tens of thousands per step). Taking turns makes a switch happen only where a
    peer has to wait anyway, and a peer that waits for a message is not woken before it has come.
    It is a schedule, nothing more: messages and collectives are the same, so are the results'
    bits. A peer able to run that waits longer than `patience` seconds for the turn runs without
    it, so user code that blocks outside the communicator while it has the turn (a sleep, an event
    another peer sets) delays the others instead of deadlocking them; after an abort everybody runs
    freely.

    Each peer belongs to one of `lanes` lanes for good (`enter(lane)`), and each lane has its own
    turn: with two lanes two peers run at once, one of each. Messages cross lanes as they cross
    peers; a peer waiting for a message from another lane hands its own lane's turn on.
    """

    def __init__(self, patience: float, lanes: int = 1):
        self._patience = patience
        self._lock = threading.Lock()
        self._ready: List["collections.deque[_Waiter]"] = [
            collections.deque() for _ in range(lanes)
        ]
        self._blocked: Dict[tuple, _Waiter] = {}  # mailbox key -> the peer waiting for a message
        self._taken = [False] * lanes
        self._broken = False
        self._mine = threading.local()

    def holding(self) -> bool:
        return getattr(self._mine, "turn", False)

    # ---- under self._lock ------------------------------------------------------------------------
    def _make_ready(self, waiter: _Waiter) -> None:
        if self._taken[waiter.lane]:
            waiter.ready_since = time.monotonic()
            self._ready[waiter.lane].append(waiter)
        else:
            self._taken[waiter.lane] = waiter.granted = True
            waiter.gate.release()

    def _hand_over(self, lane: int) -> None:
        """The holder of `lane`'s turn stops: the peer of that lane that became able to run last
        gets it."""
        if self._ready[lane]:
            waiter = self._ready[lane].pop()
            waiter.granted = True
            waiter.gate.release()
        else:
            self._taken[lane] = False

    # ---- for the peer threads ----------------------------------------------------------------------
    def _wait(self, waiter: _Waiter, check: Optional[Callable[[], None]]) -> None:
        """Wait until `waiter` is granted the turn. While it waits for a message, `check` may raise
        (an abort, the deadline); once able to run, it goes on without the turn after waiting
        `patience` seconds."""
        while not waiter.gate.acquire(timeout=_TURN_POLL_SECONDS):
            with self._lock:
                ready = waiter.ready_since is not None
                if (
                    not waiter.granted
                    and ready
                    and time.monotonic() - waiter.ready_since > self._patience
                ):
                    self._ready[waiter.lane].remove(waiter)
                    return  # out of patience: run without the turn
            if not ready and check is not None:
                try:
                    check()
                except BaseException:
                    self._leave(waiter)
                    raise
        self._mine.turn = waiter.granted  # False when an abort opened the gate

    def _leave(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter.granted:
                self._hand_over(waiter.lane)  # it was granted just now: pass it on
            elif self._blocked.get(waiter.key) is waiter:
                del self._blocked[waiter.key]
            elif waiter in self._ready[waiter.lane]:
                self._ready[waiter.lane].remove(waiter)

    def enter(self, lane: int = 0) -> None:
        """A peer thread starts: it takes the turns of `lane` from now on (other threads never
        take turns)."""
        self._mine.peer = True
        self._mine.lane = lane
        self.take()

    def _rejoin(self) -> None:
        """A peer thread that ran without the turn (out of patience) queues for it again."""
        if getattr(self._mine, "peer", False) and not self.holding():
            self.take()

    def take(self) -> None:
        """Wait for the turn (a peer starting, or leaving a collective)."""
        with self._lock:
            if self._broken:
                return
            waiter = _Waiter(self._mine.lane)
            self._make_ready(waiter)
        self._wait(waiter, None)

    def give(self) -> None:
        """Stop running: hand the turn on (a no-op for a thread that does not hold it)."""
        if not self.holding():
            return
        self._mine.turn = False
        with self._lock:
            self._hand_over(self._mine.lane)

    @contextlib.contextmanager
    def released(self):
        """Give the turn up while blocking in what follows, and wait for it again afterwards."""
        self.give()
        try:
            yield
        finally:
            self._rejoin()

    def post(self, key: tuple, box: "queue.SimpleQueue", message: Tensor) -> None:
        """Put a message in a mailbox; the peer waiting for it becomes able to run."""
        with self._lock:
            box.put(message)
            waiter = self._blocked.pop(key, None)
            if waiter is not None and not self._broken:
                self._make_ready(waiter)

    def receive(
        self, key: tuple, box: "queue.SimpleQueue", check: Callable[[], None]
    ) -> Optional[Tensor]:
        """The next message of a mailbox, for the turn's holder, which keeps (or gets back) the
        turn: if it is not there, the turn goes on until the message has come and this peer's
        turn is next. None (nothing taken) for a thread that is not a peer's, or after an abort."""
        self._rejoin()
        with self._lock:
            if not self.holding() or self._broken:
                return None
            try:
                return box.get_nowait()
            except queue.Empty:
                pass
            waiter = self._blocked[key] = _Waiter(self._mine.lane, key)
            self._mine.turn = False
            self._hand_over(waiter.lane)
        self._wait(waiter, check)
        try:
            return box.get_nowait()
        except queue.Empty:  # an abort opened the gate before the message came
            check()
            return None

    def abort(self) -> None:
        """Release everybody for good: after a failure nobody waits for a turn."""
        with self._lock:
            self._broken = True
            for waiter in [*(w for ready in self._ready for w in ready), *self._blocked.values()]:
                waiter.gate.release()
            for ready in self._ready:
                ready.clear()
            self._blocked.clear()


__all__ = ["Turns"]
