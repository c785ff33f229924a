"""The join side of the detected membership (`membership.detected`): a peer removed earlier,
restarted with `gossip-train --rejoin ID`, admitted back by the members.

The process posts `membership/join/ID` (its config digest, its liveness announcement) and waits
(`await_admission`). A member that finds the request (it looks every LOOK_SECONDS at the start of a
step) proposes the epoch with the joiner under `membership/E` ("joined": [ID]), first writer wins
as for a loss. A join does not interrupt the gossip: each member posts `membership/E/at/K` = the
first step it has not started (from inside a wait, where the proposal is seen, or at the start of
a step) and blocks at that step's start until every member has posted; the epoch takes effect at
the largest post, which the members behind reach training with gossip as usual (neighbours' steps
differ by at most one, so their posts do), and they meet in the store at its start
(`membership/E/ready/K`) before leaving the old group. Edges that stay keep their state; the
joiner is handed its state over the new group (`membership.transfer`) and the change's shift is
measured. Every agreed epoch's step and members are in `membership/E/step` (losses' too), from
which the joiner rebuilds the membership. A request whose config differs, or that comes too late
(the agreed step at or past the run's end, `membership/over` set), is answered in
`membership/join/ID/answer` and the joiner ends with one line. A loss while a join is being agreed
ends the run, naming both peers (one change at a time).
"""

from __future__ import annotations

import json
import socket
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from ..errors import CommunicationError

if TYPE_CHECKING:
    from ..faults import Monitor

__all__ = ["JoinAgreement", "await_admission", "readmit"]

#: How often a member looks for join requests.
LOOK_SECONDS = 0.25
#: How often a member waiting for the others' posts looks again.
WAIT_SECONDS = 0.02
#: How often a process waiting for its admission looks at the store.
ADMISSION_SECONDS = 0.1


class JoinAgreement:
    """The members' side of joins, mixed into `membership.detected.DetectedChanges` (which has
    `peer`, `monitor`, `timeout`, `changes`, `_store` and `_lost`)."""

    def _init_joins(self) -> None:
        #: the run's steps (a join agreed at or past them is refused), this run's config digest
        self.steps: Optional[int] = None
        self.config_digest = ""
        self.joins: Set[int] = set()  # numbers of the epochs that admitted a peer
        self._step = 0  # the step this peer is in (its last `before_step`)
        self._join: Optional[Dict] = None  # a join being agreed: number, proposal
        self._ready: Optional[Tuple[int, int]] = None  # (epoch, step): meet before it takes effect
        self._next_join_look = 0.0

    def _seen_proposal(self, number: int, proposal: Dict) -> bool:
        """A proposal of epoch `number` seen in a wait: a join is posted for now (the gossip goes
        on: True); a loss interrupts (False)."""
        if "joined" not in proposal:
            return False
        self._take_join(number, proposal, self._step + 1)
        return True

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
        posts = self._wait_for_join_posts([f"{key}/at/{k}" for k in members], members, also)
        at = max(max(p["step"] for p in posts), membership.last.step + 1)
        self._join = None
        if self.steps is not None and at >= self.steps:
            for peer in joined:
                self._answer(peer, f"the run ends at step {self.steps}, before its admission")
            return
        epoch = membership.append(at, proposal["live"])
        self._store("set", f"{key}/step", json.dumps({"step": at, "live": list(epoch.live)}))
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
        self._wait_for_join_keys(
            [f"{key}/{k}" for k in before], before, "before the join took effect"
        )

    def _wait_for_join_posts(self, keys: List[str], live: Tuple[int, ...], also: str) -> List[Dict]:
        """Every member's post `keys[k]`, read as JSON (`_wait_for_join_keys`)."""
        self._wait_for_join_keys(keys, live, also)
        return [json.loads(self._store("get", name)) for name in keys]

    def _wait_for_join_keys(self, keys: List[str], live: Tuple[int, ...], also: str) -> None:
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


def _current_announcements(driver: JoinAgreement, announce: bytes) -> None:
    """At its admission: post this process's announcement as peer `me`'s set-up entry
    (`hello/ID`: digest|device|announcement), for peers that join later, and watch every other
    member by its entry now. The entries read at start-up may be stale: a peer that rejoined since
    runs in another process (watched by the old one's pid or port, it would be found lost at once
    and removed though alive)."""
    me, store = driver.rank, driver._store
    fields = store("get", f"hello/{me}").decode().split("|")
    store("set", f"hello/{me}", "|".join(fields[:2] + [announce.hex()]))
    for peer in driver.peer.membership.last.live:
        if peer == me or not store("check", [f"hello/{peer}"]):
            continue
        entry = store("get", f"hello/{peer}").decode().split("|")
        if len(entry) == 3 and entry[2]:
            readmit(driver.monitor, peer, bytes.fromhex(entry[2]))


def _caught_up(driver: JoinAgreement) -> None:
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
        agreed = json.loads(driver._store("get", f"{key}/step"))
        membership.append(agreed["step"], agreed["live"])


def await_admission(driver: JoinAgreement, announce: bytes) -> int:
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
            _current_announcements(driver, announce)
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
