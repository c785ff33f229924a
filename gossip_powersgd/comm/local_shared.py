"""What the peers of one `LocalCluster.run` share: the in-memory medium their `LocalCommunicator`s
talk through — a mailbox per (source, destination, channel), a barrier for collectives whose
completed rounds stay completed, the abort flag that releases every waiter, and in a cooperative
cluster the turns (`comm.turns.Turns`)."""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Dict, List, Optional

from .base import Tensor
from .turns import Turns

#: In a cooperative cluster, how long a peer waits for its turn before it runs without one.
_PATIENCE_SECONDS = 5.0


class _Barrier:
    """A reusable barrier whose completed rounds stay completed.

    `threading.Barrier.abort()` also fails the threads of a round that has just completed but that
    have not woken up yet, so a peer that failed right after a collective would turn its
    neighbours' finished collective into an abort, and hide their own (identical) errors. Here a
    waiter whose round completed returns normally even if the barrier is broken afterwards; a
    timeout breaks it for everyone, as threading's does.
    """

    def __init__(self, parties: int):
        self._cond = threading.Condition()
        self._parties = parties
        self._arrived = 0
        self._round = 0
        self._broken = False

    def wait(self, timeout: Optional[float] = None) -> None:
        with self._cond:
            if self._broken:
                raise threading.BrokenBarrierError
            this_round = self._round
            self._arrived += 1
            if self._arrived == self._parties:
                self._arrived = 0
                self._round += 1
                self._cond.notify_all()
                return
            self._cond.wait_for(lambda: self._round != this_round or self._broken, timeout)
            if self._round != this_round:
                return
            self._broken = True
            self._cond.notify_all()
            raise threading.BrokenBarrierError

    def abort(self) -> None:
        with self._cond:
            self._broken = True
            self._cond.notify_all()


class _Shared:
    """State the peers of one `run` share: mailboxes, a barrier for collectives, the abort flag."""

    def __init__(self, size: int, cooperative: bool = False, lanes: int = 1):
        self.size = size
        self.turns: Optional[Turns] = Turns(_PATIENCE_SECONDS, lanes) if cooperative else None
        self.mailboxes: Dict[tuple, "queue.SimpleQueue"] = {}
        self.mailbox_lock = threading.Lock()
        self.barrier = _Barrier(size)
        self.slots: List[Any] = [None] * size
        self.results: List[Any] = [None] * size  # the shared-memory all-reduce's finished chunks
        self.ops: List[Any] = [None] * size  # and each peer's reduce op
        self.aborted = threading.Event()
        self.failed_rank: Optional[int] = None
        self.interrupted = False

    def mailbox(self, source: int, dest: int, channel: str = "exchange") -> "queue.SimpleQueue":
        key = (source, dest, channel)
        with self.mailbox_lock:
            box = self.mailboxes.get(key)
            if box is None:
                box = self.mailboxes[key] = queue.SimpleQueue()
            return box

    def post(self, source: int, dest: int, message: Tensor, channel: str = "exchange") -> None:
        box = self.mailbox(source, dest, channel)
        if self.turns is None:
            box.put(message)
        else:
            self.turns.post((source, dest, channel), box, message)

    def abort(self, rank: int) -> None:
        if not self.aborted.is_set():
            self.failed_rank = rank
            self.aborted.set()
        self.barrier.abort()
        if self.turns is not None:
            self.turns.abort()

    def released(self):
        """`Turns.released` in a cooperative cluster, else nothing."""
        return self.turns.released() if self.turns is not None else contextlib.nullcontext()
