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
    membership/E/outcome        "done" once every member of the proposal has posted, "revise" if
                                a member was found lost first (compare_set: decided once)
    membership/E/revision/R     revision R >= 1 of the proposal: the previous one's members less
    membership/E/R/at/K         the peers found lost meanwhile (two peers lost together, or one
    membership/E/R/outcome      lost while the others agree), posted and decided the same way

Once every member of the proposal (or of its last revision) has posted, each one appends the same
epoch at the same step: the largest step posted (a step none has started: each waits in `before_step`), at least one after
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

Losses outside the gossip step: an evaluation, a log record or a checkpoint's agreement that a
loss interrupts is skipped on the members it interrupted (`training.churn_run.ChurnRun.guard`: the
others may have finished it; a checkpoint file is written whole before its agreement), and the
next step agrees as above. At the end of the run (after the last step) the members agree at once
and apply the change (`ChurnRun.settle`), evaluate again, and do the summary and the end-of-run
barrier again over the new membership.

Joins (`gossip-train --rejoin ID`): `membership.joins` (the members' side mixed into
`DetectedChanges`; `await_admission`, the joiner's). Every agreed epoch's step and members are
also in `membership/E/step`, for a joiner to rebuild the membership from.

Limits of this version: the loss of the store's host (rank 0's process, or torchrun's first agent)
is not survived; a peer lost during set-up ends the run as under abort; a peer lost while the
members build the next epoch's group ends the run.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..errors import CommunicationError
from ..faults.monitor import end_stopped
from .joins import JoinAgreement, await_admission, readmit

if TYPE_CHECKING:
    from ..faults import Monitor, PeerLost
    from .peer import PeerMembership

__all__ = ["DetectedChanges", "LOOK_SECONDS", "await_admission", "readmit"]

#: How often a rank that found nothing itself looks in the store for another survivor's proposal.
LOOK_SECONDS = 0.25
#: How often a survivor waiting for the others' posts looks again.
WAIT_SECONDS = 0.02


class DetectedChanges(JoinAgreement):
    """One survivor's side of the protocol (module docstring), for `peer` on a torch transport."""

    def __init__(self, peer: PeerMembership, store, monitor: Monitor, timeout: float):
        self.peer, self.store, self.monitor, self.timeout = peer, store, monitor, timeout
        #: One entry per agreed change: epoch, step, lost {id: how}, by, detected (time.time() of
        #: the first detection), agreed (this rank's time.time() when the epoch was appended).
        self.changes: List[Dict] = []
        self._next_look = 0.0
        self._proposed = False  # the store holds a proposal for the next epoch
        self._init_joins()

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
        last = self.peer.membership.last
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
            if self._proposed and self.rank in last.live:  # a join: posted, the gossip goes on
                self._proposed = not self._seen_proposal(
                    last.number + 1, json.loads(self._store("get", key))
                )
        if self._proposed:
            return "another survivor found a peer lost"
        return None

    # ---- the loop's side -------------------------------------------------------------------------
    def before_step(self, step: int) -> None:
        """At the start of `step`, before `PeerMembership.advance`: agree on a change if a peer
        was found lost (collective over the survivors, through the store)."""
        self._step = step
        if self.peer.epoch.number < self.peer.membership.last.number:
            self._meet(step)  # a join's: the members meet before it takes effect
            return  # agreed already: the steps up to it are trained (a loss's without gossip)
        if self._join is None and self.interrupted() is not None:
            self._agree(step)
        elif self._join is None:
            self._look_for_joiners(step)
        if self._join is not None:  # a join proposed (here or seen in a wait)
            self._admit(step)
            self._meet(step)

    def _agree(self, step: int) -> None:
        membership = self.peer.membership
        number = membership.last.number + 1
        key = f"membership/{number}"
        proposal = self._propose(key, {})
        if "joined" in proposal:
            raise CommunicationError(
                f"rank {self.rank}: a peer was lost while peer {proposal['joined'][0]} was being "
                "admitted: this version admits or loses one peer at a time"
            )
        counters = {
            k: v for k, v in self.peer.algorithm.inner.node_state().items() if isinstance(v, int)
        }
        post = json.dumps({"step": step, "counters": counters})
        revision = 0
        while True:  # until every member of a revision has posted (module docstring)
            live = tuple(proposal["live"])
            if self.rank not in live:
                raise CommunicationError(
                    f"rank {self.rank}: the other peers found this peer lost "
                    f"({proposal['lost'].get(str(self.rank), '?')}, seen by rank "
                    f"{proposal['by']}) and went on without it: it ends here (restart it with "
                    f"--rejoin {self.rank} to take part again)"
                )
            here = f"{key}/{revision}" if revision else key
            self._store("set", f"{here}/at/{self.rank}", post)
            posts = self._wait_for_posts(here, live)
            if posts is not None:
                break
            revision += 1
            proposal = self._propose(f"{key}/revision/{revision}", proposal)
        at = max(max(p["step"] for p in posts), membership.last.step + 1)
        agreed = {name: max(p["counters"][name] for p in posts) for name in counters}
        epoch = membership.append(at, live)
        self._store("set", f"{key}/step", json.dumps({"step": at, "live": list(live)}))
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
            f"{','.join(map(str, live))}, go on without "
            f"{'them' if len(proposal['lost']) > 1 else 'it'} from step {at} (epoch {epoch.number})",
            flush=True,
        )

    def _propose(self, key: str, previous: Dict) -> Dict:
        """The proposal at `key`: this rank's (the members of `previous`, or of the last epoch,
        less the peers it found lost) if it is the first to write one, else the winner's."""
        members = previous.get("live", self.peer.membership.last.live)
        lost = [(e, t) for e, t in self._lost() if e.peer in members]
        if not lost:  # another member found the loss: its proposal (the store's get waits)
            return json.loads(self._store("get", key))
        gone = {str(e.peer): e.how for e, _ in lost}
        mine = {
            "live": [k for k in members if str(k) not in gone],
            "lost": {**previous.get("lost", {}), **gone},
            "by": self.rank,
            "detected": previous.get("detected", min(t for _, t in lost)),
        }
        return json.loads(self._store("compare_set", key, "", json.dumps(mine)))

    def _wait_for_posts(self, key: str, live: Tuple[int, ...]) -> Optional[List[Dict]]:
        """Every member's post for the proposal (or revision) `key`, or None if it must be
        revised: a member was found lost before all had posted. Which one it is, is decided once
        in the store (`key/outcome`, first writer wins), so every member sees the same; a
        one-line error if the members have not posted within the comm timeout and the time their
        monitors take to find the loss (a member posts once it has found it, or read the proposal;
        one whose wait timed out first gives its monitor that long too, `raise_if_lost`)."""
        keys = [f"{key}/at/{k}" for k in live]
        outcome_key = f"{key}/outcome"
        deadline = time.monotonic() + self.timeout + self.monitor.finding_seconds()
        while True:
            if self._store("check", [outcome_key]):
                outcome = self._store("get", outcome_key).decode()
            elif self._store("check", keys):
                outcome = self._store("compare_set", outcome_key, "", "done").decode()
            elif any(e.peer in live for e, _ in self._lost()):
                outcome = self._store("compare_set", outcome_key, "", "revise").decode()
            elif time.monotonic() > deadline:
                missing = [k for k, name in zip(live, keys) if not self._store("check", [name])]
                raise CommunicationError(
                    f"rank {self.rank}: peers {missing} did not join the agreement on membership "
                    f"{key.split('/')[1]} within {self.timeout + self.monitor.finding_seconds():g} "
                    "s (comm_timeout, and the time a monitor takes to find a loss)"
                )
            else:
                time.sleep(WAIT_SECONDS)
                continue
            if outcome == "done":
                return [json.loads(self._store("get", name)) for name in keys]
            return None

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
