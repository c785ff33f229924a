"""Why a torch.distributed peer left, told through the rendezvous store (used by `TorchCommunicator`).

gloo's waits cannot be interrupted, so a watchdog thread does the looking while the main thread
waits. It ends a peer of this machine found stopped (see `liveness`) with SIGKILL, since torchrun
would only send that 30 s after a SIGTERM that a stopped process never acts on. Before the kill,
every rank still waiting prints its line naming that peer (the launcher takes the job down within a
fraction of a second of the kill, and a line not yet written would be lost). The store keeps:

    cause        the first root cause recorded (one line, text)
    fault        set once a stopped peer is being ended
    spoken       how many ranks have printed their line about the fault
    waiting/K    the peers rank K gave up waiting for (so that a rank whose neighbours timed out
                 too names the peer they waited for, not them)
    left/K       rank K left for good, and was counted once in `failed` on its behalf (it never
                 counts itself), so `exit_after_peers` does not wait for it
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import List, Optional

from ..utils import write_stderr_line
from .base import CommunicationError
from .liveness import CHECK_SECONDS, STOPPED_HOW, StopWatch, is_stopped, stopped_message

#: Seconds the rank that ends a stopped peer waits for the other ranks to print their line first.
SPEAK_SECONDS = 3.0
#: Seconds a rank whose wait timed out gives the others that timed out with it to say whom they
#: waited for.
TELL_SECONDS = 1.0


class PeerWatch:
    """The fault side of one `TorchCommunicator`: `awaited` is set by its waits."""

    def __init__(self, store, rank: int, size: int, watch: StopWatch):
        self.store, self.rank, self.size, self.watch = store, rank, size, watch
        self.awaited: Optional[List[int]] = None  # the peers the main thread waits for now
        self.ended: Optional[int] = None  # a stopped peer this rank found
        self.spoke = False  # this rank has printed its line about a fault
        self._closing = threading.Event()
        if size > 1:
            threading.Thread(target=self._run, name=f"gossip-watchdog-{rank}", daemon=True).start()

    def close(self) -> None:
        self._closing.set()

    # ---- the main thread's side -------------------------------------------------------------
    def failure(self, what: str, peers: List[int]) -> CommunicationError:
        """The error of a failed wait, naming the root cause when one is known."""
        if self.spoke:  # the line is out, and the launcher is taking the job down
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        short = what.split(" (")[0]
        if self.ended is not None:
            return CommunicationError(stopped_message(self.rank, self.ended, self.watch.after))
        cause = self._get("cause")
        if cause:
            return CommunicationError(f"rank {self.rank}: {cause} ({short})")
        stopped = self.watch.stopped_now(peers)
        if stopped:
            return CommunicationError(
                f"rank {self.rank}: {short} (peer {stopped[0]} is {STOPPED_HOW})"
            )
        gone = self.watch.gone_now(peers)
        if gone:
            return CommunicationError(
                f"rank {self.rank}: {short} (the process of peer {gone[0]} has "
                "ended: killed, or crashed?)"
            )
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
        stopped = self.watch.stopped_now(roots)
        note = f"peer {stopped[0]} is {STOPPED_HOW}" if stopped else "is it alive?"
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

    def _add(self, key: str, amount: int) -> int:
        try:
            return self.store.add(key, amount)
        except Exception:  # noqa: BLE001
            return -1

    # ---- the watchdog ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closing.wait(CHECK_SECONDS):
            awaited = self.awaited
            peer = self.watch.check(awaited or [])
            if peer is not None:
                self._end(peer)
                return
            if awaited and self._get("fault"):
                self._speak(
                    f"rank {self.rank}: {self._get('cause')} (this rank waited for peers "
                    f"{sorted(set(awaited))}, which cannot go on without it)"
                )
                return

    def _speak(self, line: str) -> None:
        write_stderr_line(f"error (rank {self.rank}): {line}")
        self.spoke = True
        self._add("spoken", 1)

    def _end(self, peer: int) -> None:
        """End stopped `peer`: record why, let every waiting rank say so, then SIGKILL it."""
        self.ended = peer
        if self._add(f"ending/{peer}", 1) != 1:  # another rank found it first and ends it
            self._speak(stopped_message(self.rank, peer, self.watch.after))
            return
        self.record(
            f"peer {peer} has been {STOPPED_HOW} for {self.watch.after:g} s, and was ended",
            leaving=peer,
        )
        try:
            self.store.set("fault", "1")
        except Exception:  # noqa: BLE001
            pass
        self._speak(stopped_message(self.rank, peer, self.watch.after))
        deadline = time.monotonic() + SPEAK_SECONDS
        while self._add("spoken", 0) < self.size - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = self.watch.pids[peer]
        if is_stopped(pid):
            os.kill(pid, signal.SIGKILL)  # its connections close, and every wait fails at once


__all__ = ["PeerWatch", "SPEAK_SECONDS"]
