"""Peer liveness, and what a rank does when a peer is lost: failure handling in one place.

Every process of a launched run (an MPI rank, a torch.distributed process) holds one `Monitor`, a
daemon thread started before anything can block: before MPI_Init, before the rendezvous. It turns
the signals of `liveness` into one kind of event, `PeerLost(peer, how, host)`:

    stopped      a peer of this machine whose process state has been T (SIGSTOP, Ctrl-Z) for
                 `stopped_after` seconds of our own looking (found in /proc, then by set-up's pids).
    killed       a peer whose process ended without saying it leaves: gone from /proc (this
                 machine), or its probe port refuses connections (another machine).
    hung         a peer of another machine silent for `silent_after` seconds (since set-up, if
                 never heard), whose host still answers a probe: stopped (with its host) or hung.
    unreachable  the same, but its host does not answer either: link cut, host down.
    isolated     every peer of every other machine went silent at once, none answering: this
                 host may be the one cut off.

A slow peer is none of these: the kernel tells a stopped process (state T) from a slow one, and
heartbeats are sent by this thread, not the training loop, so a rank busy for minutes still beats.
Heartbeats that a firewall stops never end a run: a peer never heard is named only when its host
completes the probe's connection and nobody takes it, else it is left to the comm timeout.

Whoever finds a loss — this thread, or a transport whose wait failed (`diagnose`) — calls
`Monitor.lost`; the event goes to `on_peer_loss`, the one policy. Under **abort** (the default:
MPICH is fail-stop) this rank prints one line naming the peer, its host and how it was lost; its
heartbeats tell the other ranks, which print theirs (naming who saw it); once every reachable rank
has spoken, or SPEAK_SECONDS have passed, it ends a stopped peer of its machine (SIGKILL: a stopped
process never acts on SIGTERM) and its own process with status 1. Under **continue**
(`Monitor.policy`, set once training starts) the event goes to the membership (`Monitor.losses`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import socket
import struct
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

from . import liveness
from .liveness import PeerLost

#: How often process states are read and heartbeats sent.
CHECK_SECONDS = 1.0
#: A peer seen stopped this long is lost (or half the comm timeout if shorter, but >= GAP_SECONDS);
#: a run may set its own (`Monitor(stopped=...)`: GOSSIP_STOPPED_SECONDS, `faults.stopped_seconds`).
STOPPED_SECONDS = 15.0
#: A peer of another machine silent this long (since set-up if never heard) is probed (or half).
SILENT_SECONDS = 10.0
#: How long a probe waits for a peer's host to answer.
PROBE_SECONDS = 2.0
#: How long a rank that ends the job waits for the other ranks to say why first.
SPEAK_SECONDS = 3.0
#: A pause of this rank's own looking longer than this (stopped itself, with the whole job) starts
#: every count again: a job stopped and resumed as a whole is not taken for a loss.
GAP_SECONDS = 3 * CHECK_SECONDS
#: The ways a peer is lost, by their code in a heartbeat (1-based; 0 is none).
HOWS = ("stopped", "killed", "hung", "unreachable", "isolated", "failed")
#: The announcement a rank gives at set-up: pid, machine key, token, UDP port, probe port, up to
#: four IPv4 addresses and its host name (raw bytes, never pickle).
_ANNOUNCE = struct.Struct("!q8sIHH16s64s")
ANNOUNCE_BYTES = _ANNOUNCE.size


class _Remote:
    """A peer on another machine, as this rank reaches it."""

    def __init__(self, name: str, addresses: List[str], port: int, probe_port: int):
        self.name, self.port, self.probe_port = name, port, probe_port
        self.addresses = addresses  # where to send until it is heard; then where it was heard from
        self.heard: Optional[str] = None
        self.last = time.monotonic()  # its silence counts from set-up until it is heard

    def label(self) -> str:
        address = self.heard or (self.addresses[0] if self.addresses else "?")
        return f"{self.name} ({address})"


class Monitor:
    """The liveness of this rank's peers (see the module docstring); one per process."""

    def __init__(self, rank: int, size: int, stopped: float = STOPPED_SECONDS):
        self.rank, self.size = rank, size
        self.host = socket.gethostname()
        self.key = liveness.process_key()
        self.token = random.getrandbits(32)
        self.launcher = liveness.launcher_pid()
        self.endpoint = liveness.Endpoint(self.launcher, rank)
        self.stopped_seconds = stopped  # the run's threshold, before the comm timeout's half
        self.stopped_after, self.silent_after = stopped, SILENT_SECONDS
        self.local: Dict[int, int] = {}  # rank -> pid, for the ranks of this machine
        self.remote: Dict[int, _Remote] = {}
        self.joined = False  # the set-up table is in: no more looking for siblings
        self.event: Optional[PeerLost] = None
        self.spoken: Set[int] = set()  # ranks whose heartbeat says they have told their user
        self.leaving: Set[int] = set()  # ranks that said they end cleanly
        self.end_at: Optional[float] = None
        self.resting = False  # this rank's communicator is closed: its peers' ends are no loss
        self.closed = False
        self.policy = "abort"  # "continue": set by the membership once training starts
        self.removed: Set[int] = set()  # peers lost under continue: no longer watched
        self.losses: List[Tuple[PeerLost, float]] = []  # (event, time.time() of detection)
        self._stopped_since: Dict[int, float] = {}
        self._last_look = -float("inf")
        self._seq = 0
        self._early: Dict[int, Tuple[int, str, float]] = {}  # before `join`: token, source, time
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="gossip-liveness", daemon=True).start()
        atexit.register(self.leave)

    # ---- set-up ------------------------------------------------------------------------------------
    def announce(self) -> bytes:
        """This rank's `ANNOUNCE_BYTES` for the set-up exchange (see `join`)."""
        addresses: List[str] = []
        master = os.environ.get("MASTER_ADDR")
        route = liveness.route_address(master) if master else None
        for address in ([route] if route else []) + liveness.local_addresses():
            if not address.startswith("127.") and address not in addresses:
                addresses.append(address)
        packed = b"".join(socket.inet_aton(a) for a in addresses[:4])
        ports, name = (self.endpoint.udp_port, self.endpoint.probe_port), self.host.encode()[:64]
        return _ANNOUNCE.pack(os.getpid(), self.key, self.token, *ports, packed, name)

    def join(self, announcements: Sequence[bytes], timeout: float) -> None:
        """Take in every rank's announcement (in rank order) once set-up has exchanged them."""
        mine = liveness.local_addresses()
        local: Dict[int, int] = {}
        remote: Dict[int, _Remote] = {}
        for k, data in enumerate(announcements):
            pid, key, token, port, probe_port, packed, name = _ANNOUNCE.unpack(bytes(data))
            if k == 0:
                self.token = token
            if k == self.rank:
                continue
            if key == self.key and key != bytes(8):
                local[k] = pid
                continue
            addresses = [socket.inet_ntoa(packed[i : i + 4]) for i in range(0, 16, 4)]
            addresses = [a for a in addresses if a != "0.0.0.0" and a not in mine]
            host = name.rstrip(b"\0").decode("utf-8", "replace")
            remote[k] = _Remote(host, addresses, port, probe_port)
        for k, (token, address, when) in list(self._early.items()):  # ranks that joined first
            if k in remote and token == self.token:
                remote[k].heard, remote[k].last = address, when
        with self._lock:
            self.local, self.remote, self.joined, self.resting = local, remote, True, False
            # a new communicator (run() again): the last run's policy, losses and ends are over
            self.policy, self.removed, self.losses, self.event = "abort", set(), [], None
            self.leaving, self.spoken = set(), set()
            half = max(timeout / 2, GAP_SECONDS)  # never below a pause of our own looking
            self.stopped_after = min(self.stopped_seconds, half)
            self.silent_after = min(SILENT_SECONDS, half)
        self._beat()  # at once: a peer stopped or cut off right after set-up has been heard

    def _watched(self, peer: int) -> bool:
        return peer not in self.leaving and peer not in self.removed

    def finding_seconds(self) -> float:
        """The longest this monitor takes to find a peer lost once it stopped or went silent: its
        threshold, a probe and two looks. (A monitor paused longer than GAP_SECONDS by a loaded
        machine starts its counts again, so a transport's wait can time out first: under continue
        a failed wait gives the membership this long to name the loss, `comm.torch_members`.)"""
        return max(self.stopped_after, self.silent_after) + PROBE_SECONDS + 2 * CHECK_SECONDS

    # ---- the transports' side ----------------------------------------------------------------------
    def host_of(self, peer: int) -> str:
        remote = self.remote.get(peer)
        return remote.label() if remote is not None else f"{self.host} (this host)"

    def stopped_now(self, peers: Sequence[int]) -> List[int]:
        """The peers among `peers` of this machine whose process is stopped at this moment."""
        return [p for p in peers if p in self.local and liveness.is_stopped(self.local[p])]

    def diagnose(self, peers: Sequence[int]) -> Optional[PeerLost]:
        """After a wait for `peers` failed: the loss behind it, found now (a peer of this machine
        stopped or gone, one of another machine that refuses or ignores a probe), else None."""
        if self.event is not None:
            return self.event
        event = None
        for peer in peers:
            pid = self.local.get(peer)
            if pid is not None and self._watched(peer):
                if liveness.is_stopped(pid):
                    since = self._stopped_since.get(peer)
                    seconds = round(time.monotonic() - since) if since is not None else 0
                    event = PeerLost(peer, "stopped", self.host_of(peer), seconds)
                elif liveness.is_gone(pid):
                    event = PeerLost(peer, "killed", self.host_of(peer))
            if event is not None:
                break
        remote = [p for p in peers if p in self.remote and self._watched(p)]
        if event is None and remote:
            event = self._probed([p for p in remote if self.remote[p].heard], 0, answers=None)
        if event is not None:
            self.lost(event)
        return self.event or event

    def lost(self, event: PeerLost) -> None:
        """Record a loss (the first one; under continue, each peer's first); apply the policy."""
        if _going_on(self, event):
            with self._lock:  # held until the event is handed over: a second finder waits for it
                if event.peer not in self.removed and not self.closed:
                    self.removed.add(event.peer)
                    on_peer_loss(self, event)
            return
        with self._lock:
            if self.event is not None or self.closed:
                return
            self.event = event
        on_peer_loss(self, event)
        self._beat()  # tell the others at once

    def rest(self) -> None:
        """This rank is done with its peers (its communicator is closed): say so in every heartbeat
        from now on, so that its end is no loss to them, and read theirs as none either."""
        self.resting = True
        self._beat(leaving=True)

    def leave(self) -> None:
        """This rank ends cleanly (its communicator closed, or the interpreter exits): tell the
        others, so that its silence is no fault, and stop looking (under the lock: no loss is
        recorded after it). Not after a loss that ends the job: that end is not a clean one."""
        with self._lock:
            if not self.closed and self.event is None:
                self._beat(leaving=True)
                self.closed = True

    # ---- the thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        next_look = 0.0
        while not self.closed:
            wake = next_look if self.end_at is None else min(next_look, self.end_at)
            for data, source in self.endpoint.wait(max(wake - time.monotonic(), 0.01)):
                self._heard(data, source)
            now = time.monotonic()
            if now >= next_look and not self.closed:
                next_look = now + CHECK_SECONDS
                self._look(now)
            if self.end_at is not None and (now >= self.end_at or self._all_spoke()):
                self._end()

    def _look(self, now: float) -> None:
        if now - self._last_look > GAP_SECONDS:  # this rank was paused itself: count again
            self._stopped_since.clear()
            for remote in self.remote.values():
                remote.last = now
        self._last_look = now
        if not self.joined:  # (a supervised sibling's child appears a moment after its parent)
            self.local.update(liveness.sibling_ranks(self.launcher, os.getpid()))
        with self._lock:  # never after `leave`'s goodbye: a later heartbeat would undo it
            if self.closed:
                return
            self._beat(leaving=self.resting)
        if self.event is None and not self.resting:
            event = self._look_at_processes(now) or self._look_at_silence(now)
            if event is not None:
                self.lost(event)

    def _look_at_processes(self, now: float) -> Optional[PeerLost]:
        for peer, pid in list(self.local.items()):
            if self.policy == "continue" and self.joined and self._watched(peer):
                if liveness.is_gone(pid):  # (under abort, a failed wait's diagnosis says it)
                    return PeerLost(peer, "killed", self.host_of(peer))
            if not self._watched(peer) or not liveness.is_stopped(pid):
                self._stopped_since.pop(peer, None)
                continue
            # from when a look saw it stopped (`now`, read before the state, may precede the stop)
            since = self._stopped_since.setdefault(peer, time.monotonic())
            if now - since >= self.stopped_after:
                return PeerLost(peer, "stopped", self.host_of(peer), self.stopped_after)
        return None

    def _look_at_silence(self, now: float) -> Optional[PeerLost]:
        heard = [p for p, r in self.remote.items() if r.heard and self._watched(p)]
        silent = [p for p in heard if now - self.remote[p].last >= self.silent_after]
        if silent:
            isolated = len(silent) == len(heard)  # every other host went quiet at once
            return self._probed(silent, round(self.silent_after), answers="hung", isolated=isolated)
        unheard = [p for p, r in self.remote.items() if not r.heard and self._watched(p)]
        unheard = [p for p in unheard if now - self.remote[p].last >= self.silent_after]
        return self._probed_unheard(unheard) if unheard else None

    def _probed_unheard(self, peers: List[int]) -> Optional[PeerLost]:
        """Probe `peers`, silent since set-up, at each address they announced: hung if a host
        answers (its monitor, there from before set-up, takes no probe); else again later."""
        found = liveness.probe_addresses(
            {p: (self.remote[p].addresses, self.remote[p].probe_port) for p in peers}, PROBE_SECONDS
        )
        for peer in peers:
            outcome, address = found.get(peer, ("silent", ""))
            if outcome == "answers":
                self.remote[peer].addresses.sort(key=lambda a: a != address)  # for its label
                return PeerLost(peer, "hung", self.host_of(peer), round(self.silent_after))
            self.remote[peer].last = time.monotonic()
        return None

    def _probed(
        self, peers: List[int], seconds: int, answers: Optional[str], isolated: bool = False
    ) -> Optional[PeerLost]:
        """Probe `peers` (of other machines, heard before); the loss it shows, named `answers`
        when a host answers (None: no loss). This host with no route, or no answer from peers on
        several hosts that are all this rank hears, makes this rank the isolated one."""
        outcome = liveness.probe(
            [(p, self.remote[p].heard, self.remote[p].probe_port) for p in peers], PROBE_SECONDS
        )
        here = f"{self.host} ({', '.join(liveness.local_addresses()) or '?'})"
        cut = [p for p in peers if outcome[p] == "noroute"]
        if cut:
            return PeerLost(
                cut[0], "isolated", here, 0, None, tuple(p for p in peers if p != cut[0])
            )
        for how, wanted in (("killed", "refused"), (answers, "answers")):
            for peer in peers:
                if how is not None and outcome[peer] == wanted:
                    return PeerLost(peer, how, self.host_of(peer), seconds)
        # "alive": its monitor accepts probes (its heartbeats lost on the way?): no loss to name
        silent = [p for p in peers if outcome[p] == "silent"]
        if not silent:
            return None
        if isolated and seconds and len({self.remote[p].name for p in silent}) > 1:
            return PeerLost(silent[0], "isolated", here, seconds, None, tuple(silent[1:]))
        return PeerLost(silent[0], "unreachable", self.host_of(silent[0]), seconds)

    # ---- heartbeats --------------------------------------------------------------------------------
    def _beat(self, leaving: bool = False) -> None:
        event = self.event
        flags = (liveness.LEAVING if leaving else 0) | (liveness.SPOKEN if event else 0)
        lost, how, seconds = -1, 0, 0
        if event is not None and event.how != "isolated":
            lost, how, seconds = event.peer, HOWS.index(event.how) + 1, int(event.seconds)
        self._seq += 1
        data = liveness.pack_heartbeat(self.rank, self.token, self._seq, flags, lost, how, seconds)
        for peer in list(self.local):
            self.endpoint.send_local(peer, data)
        for remote in list(self.remote.values()):
            for address in [remote.heard] if remote.heard else remote.addresses:
                self.endpoint.send_udp((address, remote.port), data)

    def _heard(self, data: bytes, source) -> None:
        beat = liveness.unpack_heartbeat(data)
        if beat is None:
            return
        sender, token, _, flags, lost, how, seconds = beat
        if source is not None:  # another machine: only this job's ranks, once set-up is done
            remote = self.remote.get(sender)
            if remote is None or token != self.token:
                if not self.joined:  # a rank that joined before this one: taken in at `join`
                    self._early[sender] = (token, source[0], time.monotonic())
                return
            remote.heard, remote.last = source[0], time.monotonic()
        if flags & liveness.LEAVING:
            self.leaving.add(sender)
        else:  # a new communicator of a process that had closed one
            self.leaving.discard(sender)
        if flags & liveness.SPOKEN:
            self.spoken.add(sender)
        if lost >= 0 and 1 <= how <= len(HOWS) and self.event is None:
            host = f"{self.host} (this host)" if lost == self.rank else self.host_of(lost)
            self.lost(PeerLost(lost, HOWS[how - 1], host, seconds, told_by=sender))

    # ---- ending --------------------------------------------------------------------------------------
    def _all_spoke(self) -> bool:
        event = self.event
        gone = {event.peer, *event.others} if event is not None else set()
        reachable = set(self.local) | {p for p, r in self.remote.items() if r.heard}
        return all(p in self.spoken for p in reachable - gone - self.leaving)

    def _end(self) -> None:
        """End this process (the abort policy's last act); first a stopped peer of this machine
        that this rank found itself, which would never end on its own."""
        event = self.event
        pid = self.local.get(event.peer) if event is not None else None
        if pid is not None and event.how == "stopped":
            if event.told_by is None and liveness.is_stopped(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            # the stopped peer ends first: torchrun names the first rank it sees fail as the cause
            deadline = time.monotonic() + 2 * CHECK_SECONDS
            while not liveness.is_gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        # A look's time for the launcher to pass every line on: once one rank ends, mpiexec kills.
        time.sleep(CHECK_SECONDS)
        self._beat()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing left to save
                stream.flush()
        os._exit(1)


# ---- the policy ----------------------------------------------------------------------------------
def on_peer_loss(monitor: Monitor, event: PeerLost) -> None:
    """What a rank does about a lost peer: the one policy (see the module docstring). Abort: say
    it in one line (a rank that only heard of it says who saw it), and end this process once the
    other ranks have said it too (the monitor's thread does the ending, so a main thread blocked
    in MPI_Init, the rendezvous or a collective is no obstacle). Continue: say it in one line and
    hand the event with the time.time() of its detection to the membership (`Monitor.losses`),
    which agrees with the survivors on going on without it (then `end_stopped`)."""
    going_on = _going_on(monitor, event)
    if going_on:
        line = f"warning (rank {monitor.rank}): {event.text()}: going on without it"
    elif event.peer == monitor.rank:
        line = (
            f"error (rank {monitor.rank}): rank {event.told_by} found this rank {event.how} "
            f"(on host {monitor.host}): ending it"
        )
    else:
        line = f"error (rank {monitor.rank}): {event.text()}: ending the job"
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())
    if not going_on:
        monitor.end_at = time.monotonic() + SPEAK_SECONDS
        return
    monitor.losses.append((event, time.time()))


def end_stopped(monitor: Monitor, peer: int) -> None:
    """End peer `peer` if it is a stopped process of this machine (SIGKILL: a stopped process never
    acts on SIGTERM), so that its launcher and its connections end with it: what abort does to
    a stopped peer, and continue once the survivors agreed to go on without it."""
    pid = monitor.local.get(peer)
    if pid is not None and liveness.is_stopped(pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _going_on(monitor: Monitor, event: PeerLost) -> bool:
    """Whether the continue policy applies: not to this rank itself, nor to an isolated one."""
    return monitor.policy == "continue" and event.how != "isolated" and event.peer != monitor.rank


__all__ = [
    "ANNOUNCE_BYTES",
    "CHECK_SECONDS",
    "GAP_SECONDS",
    "HOWS",
    "Monitor",
    "PeerLost",
    "PROBE_SECONDS",
    "SILENT_SECONDS",
    "SPEAK_SECONDS",
    "STOPPED_SECONDS",
    "end_stopped",
    "on_peer_loss",
]
