"""Why a torch.distributed peer left, told through the rendezvous store (used by `TorchCommunicator`).

A peer stopped, killed or cut off is found by the liveness monitor (`faults`), which says so and
ends this process; what is left here is what only the store can tell: a peer that ended its process
on its own, and, when waits time out, whom the other ranks waited for. The store keeps:

    cause        the first root cause recorded (one line, text)
    waiting/K    the peers rank K gave up waiting for (so that a rank whose neighbours timed out
                 too names the peer they waited for, not them)
    left/K       rank K left for good, and was counted once in `failed` on its behalf (it never
                 counts itself), so `exit_after_peers` does not wait for it
"""

from __future__ import annotations

import datetime
import time
from typing import List, Optional

from ..faults import Monitor
from .base import CommunicationError

#: Seconds a rank whose wait timed out gives the others that timed out with it to say whom they
#: waited for.
TELL_SECONDS = 1.0


class PeerWatch:
    """The fault side of one `TorchCommunicator`."""

    def __init__(self, store, rank: int, size: int, monitor: Optional[Monitor]):
        self.store, self.rank, self.size, self.monitor = store, rank, size, monitor

    # ---- the main thread's side -------------------------------------------------------------
    def failure(self, what: str, peers: List[int]) -> CommunicationError:
        """The error of a failed wait, naming the root cause when one is known: a peer the
        liveness monitor found lost, a cause recorded in the store, or what the monitor finds
        about `peers` now."""
        monitor = self.monitor
        if monitor is not None and monitor.event is not None:
            return CommunicationError(f"rank {self.rank}: {monitor.event.text()}")
        cause = self._get("cause")
        if cause:
            return CommunicationError(f"rank {self.rank}: {cause} ({what.split(' (')[0]})")
        event = monitor.diagnose(peers) if monitor is not None else None
        if event is not None:
            return CommunicationError(f"rank {self.rank}: {event.text()}")
        return CommunicationError(f"rank {self.rank}: {what}")

    def timed_out(self, what: str, peers: List[int]) -> CommunicationError:
        """The error of a wait for `peers` that ran out: if they gave up waiting themselves, name
        the peers at the end of that chain (the ones that wait for nobody) instead."""
        self._set(f"waiting/{self.rank}", ",".join(map(str, peers)))
        time.sleep(TELL_SECONDS)
        waits = {}
        for k in range(self.size):
            entry = self._get(f"waiting/{k}") if k != self.rank else ""
            if entry:
                waits[k] = [int(v) for v in entry.split(",")]
        roots, seen, todo = [], set(), list(peers)
        while todo:
            peer = todo.pop(0)
            if peer in seen or peer == self.rank:
                continue
            seen.add(peer)
            if peer in waits:
                todo += waits[peer]
            else:
                roots.append(peer)
        if not roots or sorted(roots) == sorted(peers):
            return self.failure(what, peers)
        event = self.monitor.diagnose(roots) if self.monitor is not None else None
        note = event.text() if event is not None else "is it alive?"
        return CommunicationError(
            f"rank {self.rank}: {what.split(' (')[0]}: they wait for peer(s) "
            f"{sorted(roots)} themselves, which sent nothing ({note})"
        )

    def tell_exit(self) -> None:
        """This process ends with its communicator open: record that it left."""
        self.record(
            f"peer {self.rank} ended its process (sys.exit, or the end of its script) "
            "before the others were done",
            leaving=self.rank,
        )

    # ---- the store ---------------------------------------------------------------------------
    def record(self, cause: str, leaving: Optional[int] = None) -> None:
        """Record `cause` (the first one wins) and count rank `leaving` once as failed."""
        try:
            if cause and self.store.add("cause/claimed", 1) == 1:
                self.store.set("cause", cause)
            if leaving is not None and self.store.add(f"left/{leaving}", 1) == 1:
                self.store.add("failed", 1)
        except Exception:  # noqa: BLE001 - the store may have ended with its host
            pass

    def _get(self, key: str) -> str:
        try:
            if self.store.check([key]):
                return self.store.get(key).decode()
        except Exception:  # noqa: BLE001 - the store may have ended with its host
            pass
        return ""

    def _set(self, key: str, value: str) -> None:
        try:
            self.store.set(key, value)
        except Exception:  # noqa: BLE001 - the store may have ended with its host
            pass


def undelivered(receives) -> List[int]:
    """The senders of the (work, sender) receives left after a timeout whose message did not
    arrive (gloo closed the connections at the timeout: a receive not complete now fails)."""
    missing = []
    for w, peer in receives:
        try:
            done = w.wait(datetime.timedelta(milliseconds=1))
        except RuntimeError:
            done = False
        if done is False:
            missing.append(peer)
    return missing


__all__ = ["PeerWatch", "undelivered"]
