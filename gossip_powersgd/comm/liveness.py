"""Telling a stopped peer from a slow one, for the transports with one peer per process.

A slow peer still runs; a peer stopped by SIGSTOP or Ctrl-Z runs nothing at all, so it never answers,
and no timeout generous enough for a slow peer ends the job early. On one machine the kernel says
which it is: a process's state in /proc/PID/stat is "T" while it is stopped. A rank that waits for
a peer of its own machine looks at that peer's state about once a second, and a peer found stopped
throughout STOPPED_SECONDS of waiting (or half the comm timeout) is named and the job ended, rather than every rank waiting out
comm_timeout and then blaming whichever neighbour it was waiting for (often a live one, itself
waiting for the stopped peer). A process held by a debugger is "t" (traced), not "T", and is left
alone. Peers on other machines are only ever named by the timeout.

`process_key` tells which peers share this machine's process ids: the same host, the same boot and
the same pid namespace (containers on one host each have their own).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from typing import Dict, Iterable, Optional

#: Seconds a peer must be seen stopped, while we wait for it, before the job is ended.
STOPPED_SECONDS = 15.0
#: How often a waiting rank looks at its peers' states.
CHECK_SECONDS = 1.0
#: What the user is told about a stopped peer (the same words on every transport).
STOPPED_HOW = "stopped (SIGSTOP or Ctrl-Z: its process state is T)"


def stopped_after(timeout: float) -> float:
    """Seconds of waiting on a stopped peer before it is named: STOPPED_SECONDS, or half the comm
    timeout if that is shorter, so that the stop, not the timeout, is what a rank reports."""
    return min(STOPPED_SECONDS, timeout / 2)


def process_key() -> bytes:
    """8 bytes equal for two processes exactly when a pid names the same process in both."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        return bytes(8)  # no /proc: never "the same machine", so nothing is looked at
    return hashlib.sha256("|".join(parts).encode()).digest()[:8]


def process_state(pid: int) -> Optional[str]:
    """The one-letter state of process `pid` ("R", "S", "T", "Z", ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def is_stopped(pid: int) -> bool:
    return process_state(pid) == "T"


def is_gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


class StopWatch:
    """Which of the peers we wait for has been stopped for `after` seconds, by our own looks.

    `pids` maps the ranks on this machine to their process ids (others are never looked at). Time
    counts only while we look: a gap of several CHECK_SECONDS between two looks (we were stopped
    ourselves, or were busy elsewhere) starts every count again, so a job that was stopped as a
    whole and resumed is not taken for one with a stopped peer.
    """

    def __init__(self, pids: Dict[int, int], after: float):
        self.pids = dict(pids)
        self.after = after
        self._since: Dict[int, float] = {}
        self._last = -float("inf")

    def due(self) -> bool:
        return bool(self.pids) and time.monotonic() - self._last >= CHECK_SECONDS

    def check(self, peers: Iterable[int]) -> Optional[int]:
        """Look at `peers` now; return one stopped for `after` seconds, else None."""
        now, peers = time.monotonic(), list(peers)
        if now - self._last > 3 * CHECK_SECONDS:
            self._since.clear()
        self._since = {p: t for p, t in self._since.items() if p in peers}
        self._last = now
        found = None
        for peer in peers:
            pid = self.pids.get(peer)
            if pid is None or not is_stopped(pid):
                self._since.pop(peer, None)
                continue
            if now - self._since.setdefault(peer, now) >= self.after and found is None:
                found = peer
        return found

    def stopped_now(self, peers: Iterable[int]) -> list:
        """The peers among `peers` whose process is stopped at this moment."""
        return [p for p in peers if p in self.pids and is_stopped(self.pids[p])]

    def gone_now(self, peers: Iterable[int]) -> list:
        """The peers among `peers` whose process has ended (killed, crashed, exited)."""
        return [p for p in peers if p in self.pids and is_gone(self.pids[p])]


def stopped_message(rank: int, peer: int, seconds: float) -> str:
    return (
        f"rank {rank}: peer {peer} has been {STOPPED_HOW} for {seconds:g} s while this rank "
        f"waited for its message, and a stopped peer never answers: ending the job (resume a "
        f"stopped peer with SIGCONT within {seconds:g} s)"
    )


__all__ = [
    "STOPPED_SECONDS",
    "CHECK_SECONDS",
    "stopped_after",
    "StopWatch",
    "process_key",
    "process_state",
    "is_stopped",
    "is_gone",
    "stopped_message",
]
