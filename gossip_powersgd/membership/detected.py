"""Membership changes that are found, not scheduled: peers lost under ``on_peer_loss: continue``
on the torch backend, removed by the survivors, who agree through the rendezvous store.

A loss comes from this rank's liveness monitor (`faults`: stopped, killed, hung, unreachable; its
`Monitor.losses`) or from the store, where another survivor proposed a change. Either one
*interrupts* the transport (`comm.torch_members`): every wait on the current group ends with
`PeerLostError`, and so does every operation started before the change takes effect. The gossip of
a step interrupted so is dropped by the algorithm (`MemberAlgorithm.step`): the step is finished
without the rest of its exchanges.

The agreement, at the start of the next step (`DetectedChanges.before_step`), in the store:

    membership/E        {"live": [...], "lost": {"K": how}, "by": id, "detected": time}: the
                        proposal of epoch E, written with compare_set: the first survivor to write
                        wins, every survivor reads the winner
    membership/E/at/K   {"step": s, "counters": {...}}: survivor K has not started step s, and
                        holds these algorithm counters (gossip steps, PowerGossip's half-steps)

Once every member of the proposal has posted, each one appends the same epoch at the same step:
the largest step posted (a step none has started: each waits in `before_step`), at least one after
the last change. A survivor behind it trains the steps up to it without gossip (its exchanges are
interrupted), then every member applies the epoch at that step (`PeerMembership.advance`): a
fresh gloo group over the members (`TorchCommunicator.set_members`), the repaired graph, and the
algorithm rebuilt with every edge fresh (the edges' state may have been half updated by the
interrupted step at one end and not at the other) and the agreed counters (the largest posted).

What it gives (the invariant): from the step of the change on, the survivors' average is preserved
exactly, as for a scheduled change. The change itself moves it by the lost peer's share and by the
terms of the interrupted step that one end of an edge applied and the other did not: no closed
form, and not measured (`measure_shift` needs the lost peer's model); `average_shift_total`
counts cooperative changes and joins only.

Joins (`gossip-train --rejoin ID`, a peer removed earlier, restarted): the process posts
`membership/join/ID` (its config digest, its liveness announcement) and waits (`await_admission`).
A member that finds the request (it looks every LOOK_SECONDS at the start of a step) proposes the
epoch with the joiner under `membership/E` ("joined": [ID]), first writer wins as above. A join
does not interrupt the gossip: each member posts `membership/E/at/K` = the first step it has not
started (from inside a wait, where the proposal is seen, or at the start of a step) and blocks at
that step's start until every member has posted; the epoch takes effect at the largest post, which
the members behind reach training with gossip as usual (neighbours' steps differ by at most one,
so their posts do), and they meet in the store at its start (`membership/E/ready/K`) before
leaving the old group. Edges that stay keep their state; the joiner is handed its state over the
new group (`membership.transfer`) and the change's shift is measured. Every agreed epoch's step is
in `membership/E/step`, from which the joiner rebuilds the membership. A request whose config
differs, or that comes too late (the agreed step at or past the run's end, `membership/over`
set), is answered in `membership/join/ID/answer` and the joiner ends with one line.

Limits of this version: a loss while a join is being agreed ends the run naming both peers; a
second loss among the survivors before a change takes effect ends the
run naming both peers (one change at a time); so does a loss during an evaluation, a checkpoint,
a log record or the end of the run (collectives outside the gossip step), and the loss of the
store's host (rank 0's process, or torchrun's first agent). A peer lost during set-up ends the run
as under abort.
"""

from __future__ import annotations

import json
import socket
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from ..errors import CommunicationError
from ..faults.monitor import end_stopped

if TYPE_CHECKING:
    from ..faults import Monitor, PeerLost
    from .peer import PeerMembership

__all__ = ["DetectedChanges", "LOOK_SECONDS", "await_admission"]

#: How often a rank that found nothing itself looks in the store for another survivor's proposal.
LOOK_SECONDS = 0.25
#: How often a survivor waiting for the others' posts looks again.
WAIT_SECONDS = 0.02
#: How often a process waiting for its admission looks at the store.
ADMISSION_SECONDS = 0.1


class DetectedChanges:
    """One survivor's side of the protocol (module docstring), for `peer` on a torch transport."""

    def __init__(self, peer: PeerMembership, store, monitor: Monitor, timeout: float):
        self.peer, self.store, self.monitor, self.timeout = peer, store, monitor, timeout
        #: One entry per agreed change: epoch, step, lost {id: how}, by, detected (time.time() of
        #: the first detection), agreed (this rank's time.time() when the epoch was appended).
        self.changes: List[Dict] = []
        self._next_look = 0.0
        self._proposed = False  # the store holds a proposal for the next epoch
        #: the run's steps (a join agreed at or past them is refused), this run's config digest
        self.steps: Optional[int] = None
        self.config_digest = ""
        self.joins: Set[int] = set()  # numbers of the epochs that admitted a peer
        self._step = 0  # the step this peer is in (its last `before_step`)
        self._join: Optional[Dict] = None  # a join being agreed: number, proposal
        self._ready: Optional[Tuple[int, int]] = None  # (epoch, step): meet before it takes effect
        self._next_join_look = 0.0

    @property
    def rank(self) -> int:
        return self.peer.rank

    def _store(self, operation: str, *args):
        """`operation` on the rendezvous store; a one-line error when the store is gone."""
        try:
            return getattr(self.store, operation)(*args)
        except RuntimeError as exc:  # DistStoreError, DistNetworkError: its host has ended
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CommunicationError(
                f"rank {self.rank}: the rendezvous store is unreachable ({first}): on_peer_loss: "
                "continue agrees on the membership through it, so its host (rank 0's process, or "
                "the first torchrun agent) must survive"
            ) from None

    # ---- the transport's question ----------------------------------------------------------------
    def _lost(self) -> List[Tuple[PeerLost, float]]:
        live = self.peer.membership.last.live
        return [(e, t) for e, t in self.monitor.losses if e.peer in live]

    def interrupted(self) -> Optional[str]:
        """Why the current group must not be used any more (None: it may)."""
        membership = self.peer.membership
        last = membership.last
        if self.peer.epoch.number < last.number and last.number not in self.joins:
            return f"membership epoch {last.number} is agreed, from step {last.step}"
        lost = self._lost()
        if lost:
            event = lost[0][0]
            return f"peer {event.peer} was lost ({event.how})"
        now = time.monotonic()
        if not self._proposed and self._join is None and now >= self._next_look:
            self._next_look = now + LOOK_SECONDS
            key = f"membership/{last.number + 1}"
            self._proposed = self._store("check", [key])
            if self._proposed and self.rank in last.live:
                proposal = json.loads(self._store("get", key))
                if "joined" in proposal:  # a join: posted now, the gossip goes on
                    self._proposed = False
                    self._take_join(last.number + 1, proposal, self._step + 1)
        if self._proposed:
            return "another survivor found a peer lost"
        return None

    # ---- the loop's side -------------------------------------------------------------------------
    def before_step(self, step: int) -> None:
        """At the start of `step`, before `PeerMembership.advance`: agree on a change if a peer
        was found lost (collective over the survivors, through the store)."""
        self._step = step
        if self.peer.epoch.number < self.peer.membership.last.number:
            self._meet(step)
            return  # agreed already: the steps up to it are trained (a loss's without gossip)
        if self._join is None and self.interrupted() is not None:
            self._agree(step)
        elif self._join is None:
            self._look_for_joiners(step)
        if self._join is not None:
            self._admit(step)
            self._meet(step)

    def _agree(self, step: int) -> None:
        membership = self.peer.membership
        number = membership.last.number + 1
        key = f"membership/{number}"
        lost = self._lost()
        if lost:
            mine = {
                "live": [k for k in membership.last.live if k not in {e.peer for e, _ in lost}],
                "lost": {str(e.peer): e.how for e, _ in lost},
                "by": self.rank,
                "detected": min(t for _, t in lost),
            }
            proposal = json.loads(self._store("compare_set", key, "", json.dumps(mine)))
        else:
            proposal = json.loads(self._store("get", key))
        live = tuple(proposal["live"])
        if self.rank not in live:
            raise CommunicationError(
                f"rank {self.rank}: the other peers found this peer lost "
                f"({proposal['lost'].get(str(self.rank), '?')}, seen by rank {proposal['by']}) and "
                f"went on without it: it ends here (restart it with --rejoin {self.rank} to take part again)"
            )
        counters = {
            k: v for k, v in self.peer.algorithm.inner.node_state().items() if isinstance(v, int)
        }
        self._store(
            "set", f"{key}/at/{self.rank}", json.dumps({"step": step, "counters": counters})
        )
        if "joined" in proposal:
            raise CommunicationError(
                f"rank {self.rank}: peer {lost[0][0].peer if lost else '?'} was lost while peer "
                f"{proposal['joined'][0]} was being admitted: this version admits or loses one "
                "peer at a time"
            )
        also = f"while the survivors agreed to go on without {sorted(proposal['lost'])}"
        posts = self._wait_for_posts([f"{key}/at/{k}" for k in live], live, also)
        at = max(max(p["step"] for p in posts), membership.last.step + 1)
        agreed = {name: max(p["counters"][name] for p in posts) for name in counters}
        epoch = membership.append(at, live)
        self._store("set", f"{key}/step", str(at))  # for a joiner's `await_admission`
        self.peer.detected[epoch.number] = agreed
        self._proposed = False
        for peer in map(int, proposal["lost"]):
            self.monitor.removed.add(peer)  # no second report of a peer removed already
            end_stopped(self.monitor, peer)
        lost_text = ", ".join(f"peer {k} ({how})" for k, how in sorted(proposal["lost"].items()))
        self.changes.append(
            {
                "epoch": epoch.number,
                "step": at,
                "lost": {int(k): how for k, how in proposal["lost"].items()},
                "by": proposal["by"],
                "detected": proposal["detected"],
                "agreed": time.time(),
            }
        )
        print(
            f"membership (rank {self.rank}): {lost_text} lost; the survivors, peers "
            f"{','.join(map(str, live))}, go on without it from step {at} (epoch {epoch.number})",
            flush=True,
        )

    def _wait_for_posts(self, keys: List[str], live: Tuple[int, ...], also: str) -> List[Dict]:
        """Every member's post `keys[k]` (one per peer of `live`), read as JSON (`_wait_for_keys`)."""
        self._wait_for_keys(keys, live, also)
        return [json.loads(self._store("get", name)) for name in keys]

    def _wait_for_keys(self, keys: List[str], live: Tuple[int, ...], also: str) -> None:
        """Until every key of `keys` (one per peer of `live`) is in the store; a one-line error if
        one of them is lost meanwhile (`also`: during what), or has not posted within the comm
        timeout."""
        deadline = time.monotonic() + self.timeout
        while not self._store("check", keys):
            lost = [e for e, _ in self._lost() if e.peer in live]
            if lost:
                raise CommunicationError(
                    f"rank {self.rank}: peer {lost[0].peer} was lost ({lost[0].how}) {also}: "
                    "this version goes on through one change at a time"
                )
            if time.monotonic() > deadline:
                missing = [k for k, name in zip(live, keys) if not self._store("check", [name])]
                raise CommunicationError(
                    f"rank {self.rank}: peers {missing} did not join the agreement on the "
                    f"membership ({keys[0].rsplit('/', 2)[0]}) within {self.timeout:g} s "
                    "(comm_timeout)"
                )
            time.sleep(WAIT_SECONDS)

    # ---- joins ---------------------------------------------------------------------------------
    def _look_for_joiners(self, step: int) -> None:
        """Every LOOK_SECONDS: a request of a peer absent now (`membership/join/K`) becomes the
        proposal of the next epoch, unless its config differs (answered, refused)."""
        now = time.monotonic()
        if now < self._next_join_look:
            return
        self._next_join_look = now + LOOK_SECONDS
        last = self.peer.membership.last
        for peer in [k for k in range(self.peer.membership.size) if k not in last.live]:
            request_key = f"membership/join/{peer}"
            if not self._store("check", [request_key]):
                continue
            request = json.loads(self._store("get", request_key))
            if request["config"] != self.config_digest:
                self._answer(
                    peer,
                    "its config differs from the running members' (rejoin with the run's own config)",
                )
                continue
            mine = {
                "live": sorted({*last.live, peer}),
                "joined": [peer],
                "by": self.rank,
                "requested": request["time"],
                "announce": request["announce"],
            }
            key = f"membership/{last.number + 1}"
            proposal = json.loads(self._store("compare_set", key, "", json.dumps(mine)))
            if "joined" in proposal:
                self._take_join(last.number + 1, proposal, step)
            else:  # a loss was proposed first: agreed at the next step
                self._proposed = True
            return

    def _answer(self, peer: int, reason: str) -> None:
        self._store("set", f"membership/join/{peer}/answer", reason)
        self._store("delete_key", f"membership/join/{peer}")

    def _take_join(self, number: int, proposal: Dict, first: int) -> None:
        """Post for the join `proposal` of epoch `number`: `first`, the first step this peer has
        not started (it blocks at the start of that step until every member has posted)."""
        self._join = {"number": number, "proposal": proposal}
        self._store("set", f"membership/{number}/at/{self.rank}", json.dumps({"step": first}))

    def _admit(self, step: int) -> None:
        """Agree on the join being proposed (blocks until every member has posted)."""
        membership = self.peer.membership
        number, proposal = self._join["number"], self._join["proposal"]
        key, members = f"membership/{number}", membership.last.live
        joined = proposal["joined"]
        also = f"while the members admitted peer {joined[0]}"
        posts = self._wait_for_posts([f"{key}/at/{k}" for k in members], members, also)
        at = max(max(p["step"] for p in posts), membership.last.step + 1)
        self._join = None
        if self.steps is not None and at >= self.steps:
            for peer in joined:
                self._answer(peer, f"the run ends at step {self.steps}, before its admission")
            return
        epoch = membership.append(at, proposal["live"])
        self._store("set", f"{key}/step", str(at))
        for peer in joined:
            self._store("delete_key", f"membership/join/{peer}")
            readmit(self.monitor, peer, bytes.fromhex(proposal["announce"]))
        self.joins.add(epoch.number)
        self._ready = (epoch.number, at)
        self.changes.append(
            {
                "epoch": epoch.number,
                "step": at,
                "lost": {},
                "joined": joined,
                "by": proposal["by"],
                "requested": proposal["requested"],
                "agreed": time.time(),
            }
        )
        print(
            f"membership (rank {self.rank}): peer {joined[0]} rejoins; the members, peers "
            f"{','.join(map(str, epoch.live))}, from step {at} (epoch {epoch.number})",
            flush=True,
        )

    def _meet(self, step: int) -> None:
        """At the step a join takes effect: wait in the store for the other old members, so that
        no one leaves the old group while another still finishes a step on it."""
        if self._ready is None or self._ready[1] != step:
            return
        number = self._ready[0]
        self._ready = None
        before = self.peer.membership.epochs[number - 1].live
        key = f"membership/{number}/ready"
        self._store("set", f"{key}/{self.rank}", "1")
        self._wait_for_keys([f"{key}/{k}" for k in before], before, "before the join took effect")

    def continued(self, number: int) -> None:
        """Epoch `number` took effect on this peer now (the page's detection-to-continuation)."""
        for change in self.changes:
            if change["epoch"] == number:
                change["continued"] = time.time()


def detected_changes(peer: PeerMembership, transport) -> Optional[DetectedChanges]:
    """The driver of detected changes for `peer` on `transport`, and the transport and the monitor
    switched to the continue policy; None where losses are not detected (in-process, one peer)."""
    from .. import faults

    monitor = faults.current()
    if not hasattr(transport, "set_members") or monitor is None:
        return None
    driver = DetectedChanges(peer, transport._store, monitor, transport.timeout)
    transport.interrupted = driver.interrupted
    monitor.policy = "continue"
    return driver


def readmit(monitor: Monitor, peer: int, announcement: bytes) -> None:
    """Make `monitor` (`faults.Monitor`) watch `peer` again, a process admitted back with this
    announcement (its `Monitor.announce()`, read as `Monitor.join` reads the set-up's): its
    earlier loss forgotten, its process or host in the tables in place of the old one's."""
    from ..faults.monitor import _ANNOUNCE, _Remote, liveness

    pid, key, _, port, probe_port, packed, name = _ANNOUNCE.unpack(announcement)
    with monitor._lock:
        monitor.losses = [(e, t) for e, t in monitor.losses if e.peer != peer]
        for table in (monitor.removed, monitor.leaving):
            table.discard(peer)
        for table in (monitor._stopped_since, monitor.local, monitor.remote):
            table.pop(peer, None)
        if key == monitor.key and key != bytes(8):
            monitor.local[peer] = pid
            return
        addresses = [socket.inet_ntoa(packed[i : i + 4]) for i in range(0, 16, 4)]
        mine = liveness.local_addresses()
        host = name.rstrip(b"\0").decode("utf-8", "replace")
        addresses = [a for a in addresses if a != "0.0.0.0" and a not in mine]
        monitor.remote[peer] = _Remote(host, addresses, port, probe_port)


def _caught_up(driver: DetectedChanges) -> None:
    """Append to the joiner's membership every epoch the members agreed on since (from the store:
    `membership/E` and `membership/E/step`; one still being agreed is waited for)."""
    membership = driver.peer.membership
    while driver._store("check", [f"membership/{membership.last.number + 1}"]):
        key = f"membership/{membership.last.number + 1}"
        if not driver._store("check", [f"{key}/step"]):
            proposal = json.loads(driver._store("get", key))
            if driver.rank in proposal.get("joined", ()):  # this peer's admission, being agreed
                return
            time.sleep(ADMISSION_SECONDS)  # a change being agreed (or one refused at the end)
            if driver._store("check", ["membership/over"]):
                return
            continue
        live = json.loads(driver._store("get", key))["live"]
        membership.append(int(driver._store("get", f"{key}/step")), live)


def await_admission(driver: DetectedChanges, announce: bytes) -> int:
    """A rejoining peer's side (module docstring): post the request, wait until the members admit
    it; the step of its admission. One line (CommunicationError) when it is still a member, when
    the members refuse it, or when the run ended first. No deadline: the members take requests
    up at the start of a step, however far they are from it."""
    me, membership = driver.rank, driver.peer.membership
    if driver._store("check", ["membership/over"]):
        raise CommunicationError(f"rank {me}: --rejoin: the run has ended; nothing to rejoin")
    deadline = time.monotonic() + driver.timeout  # a peer just killed is found lost within it
    _caught_up(driver)
    while me in membership.last.live and time.monotonic() < deadline:
        time.sleep(ADMISSION_SECONDS)
        _caught_up(driver)
    if me in membership.last.live:
        raise CommunicationError(
            f"rank {me}: --rejoin {me}: peer {me} is still a member of the run ({membership.last.describe()}): "
            f"only a peer the others removed can rejoin (is its process still running? waited "
            f"{driver.timeout:g} s, comm_timeout)"
        )
    request = {"config": driver.config_digest, "announce": announce.hex(), "time": time.time()}
    driver._store("delete_key", f"membership/join/{me}/answer")
    driver._store("set", f"membership/join/{me}", json.dumps(request))
    while True:
        _caught_up(driver)
        if me in membership.last.live:
            driver.joins.add(membership.last.number)
            driver.monitor.resting = False  # a member: its peers are watched from now on
            return membership.last.step
        if driver._store("check", [f"membership/join/{me}/answer"]):
            reason = driver._store("get", f"membership/join/{me}/answer").decode()
            raise CommunicationError(
                f"rank {me}: --rejoin: the members refused peer {me}: {reason}"
            )
        if driver._store("check", ["membership/over"]):
            raise CommunicationError(
                f"rank {me}: --rejoin: the run ended before the members admitted peer {me}"
            )
        time.sleep(ADMISSION_SECONDS)
