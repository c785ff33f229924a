"""The training loop's side of peers that leave and join (``on_peer_loss: continue``; the config keys
and what they refuse: `churn`).

What a membership change does to the loop (`ChurnRun`): at the start of each step every peer
applies the epoch of that step (`membership.peer.PeerMembership.advance`). A peer that is not a
member skips the step (no batch, no gradient, no gossip, no record, no checkpoint), keeping its
data position and its hooks' state (its DP accountant) for when it comes back; when it leaves, it
writes that state once (``checkpoints/rank-K-away-STEP.pt``), so that a run resumed while it is
away restores it. A joiner gets its model, optimizer state and step from its new neighbours, then
trains on its own data. Evaluations, metrics and checkpoints are over the members of the moment;
the eval records add `live_peers`, `membership_epoch`, `membership_changes` and
`average_shift_total` (the summed norms of the jumps of the members' average at the changes).
The summary's `transfer_mb_sent` is every change's state handed to joiners, summed over its senders
at the change (`membership.peer.Change.transferred`), so a sender that leaves later still counts.
The summary is written by the lowest-id member at the end; its exact-gossip baseline counts, for
each member, the graphs in force in the rounds its traffic counters cover, less the rounds whose
gossip a lost peer interrupted on it (`exact_messages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np
import torch

from ..comm.base import digest
from ..comm.transports import TRANSPORTS
from ..errors import PeerLostError
from .hooks import TrainingHooks

if TYPE_CHECKING:
    from topologies import AnyTopology

    from ..comm.base import Comm

__all__ = ["ChurnRun", "TrainingState", "call", "churn_run"]


def _scheduled(config, topology: AnyTopology, steps: int):
    """The membership of a churn schedule, with a γ given in the algorithm's spec checked on the
    graph of every epoch (before the run: the same one line on every peer)."""
    from ..membership.algorithm import check_every_epoch
    from ..membership.churn import churn_membership

    membership = churn_membership(config.churn, topology, steps)
    check_every_epoch(config.algorithm, membership)
    return membership


class TrainingState:
    """The `membership.peer.JoinState` of a training peer: model, optimizer state, step, the
    membership's own counters (so that a joiner's records go on from the members') and the
    trackers' run ids (so that a joiner that holds them continues their runs: `Tracker.handed`)."""

    def __init__(self, model, optimizer, run_state, driver):
        self.model, self.optimizer, self.run_state = model, optimizer, run_state
        self.driver = driver

    def pack(self) -> Dict[str, torch.Tensor]:
        out = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for index, fields in self.optimizer.state_dict()["state"].items():
            for key, value in fields.items():
                if isinstance(value, torch.Tensor):
                    out[f"optimizer.{index}.{key}"] = value
        out["run.step"] = torch.tensor(self.run_state.step, dtype=torch.int64)
        out["run.changes"] = torch.tensor(self.driver.changes, dtype=torch.int64)
        out["run.shift_total"] = torch.tensor(self.driver.shift_total, dtype=torch.float64)
        transferred = self.driver.transfer_bytes
        out["run.transfer_bytes"] = torch.tensor(
            -1 if transferred is None else transferred, dtype=torch.int64
        )
        for tracker in self._trackers():
            out.update({f"{tracker.key}.{k}": v for k, v in tracker.handed().items()})
        return out

    def _trackers(self):
        from .tracker_base import Tracker

        hooks = getattr(getattr(self.driver, "hooks", None), "hooks", ())  # (a HookList's)
        return [h for h in hooks if isinstance(h, Tracker)]

    def unpack(self, state: Dict[str, torch.Tensor]) -> None:
        step = int(state["run.step"])
        if step != self.run_state.step:
            raise ValueError(
                f"a joining peer is at step {self.run_state.step} but was handed the state of "
                f"step {step}: the peers disagree on the membership schedule"
            )
        model = {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}
        self.model.load_state_dict(model)
        fields: Dict[int, Dict[str, torch.Tensor]] = {}
        for name, value in state.items():
            if name.startswith("optimizer."):
                _, index, key = name.split(".", 2)
                fields.setdefault(int(index), {})[key] = value
        groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": fields, "param_groups": groups})
        self.driver.changes = int(state["run.changes"])
        self.driver.shift_total = float(state["run.shift_total"])
        transferred = int(state["run.transfer_bytes"])
        self.driver.transfer_bytes = None if transferred < 0 else transferred
        for tracker in self._trackers():
            prefix = f"{tracker.key}."
            tracker.take_handed(
                {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            )


class ChurnRun(TrainingHooks):
    """The loop's membership driver (module docstring); a hook for its records and state."""

    name = "membership"
    #: Without a churn schedule nothing changes a bit of the run, so a run may resume with
    #: on_peer_loss switched (churn itself is in the checkpoint's config hash).
    optional = True

    def __init__(self, comm: Comm, config):
        from ..comm.membership import MemberCommunicator

        self.config = config
        self.comm = MemberCommunicator(comm)
        self.peer = None
        self.detected = None  # torch: changes found by the liveness monitor (`membership.detected`)
        self.changes = 0
        self.shift_total = 0.0
        #: Bytes of state handed to joiners in the run, every change's over all its senders
        #: (`Change.transferred`); None after resuming a checkpoint from before it was kept.
        self.transfer_bytes: Optional[int] = 0
        self.run = self.hooks = self.run_dir = None
        self.placed: Optional[int] = None  # a rejoining peer: the step its loop starts at
        self.admitted: Optional[int] = None  # ... and the step it is a member again from
        #: The first step this peer's traffic counters count (a rejoining process's: its
        #: admission; the counters of the process it replaces are gone): `exact_messages`.
        self.counted_from = 0
        #: The training steps whose gossip a lost peer interrupted on this peer (torch): their
        #: unfinished exchanges counted no byte sent, so `exact_messages` counts no round there.
        self.interrupted: List[int] = []
        self._dropped_seen = 0  # the algorithm's count of them when last looked at (this process)

    # ---- set-up ----------------------------------------------------------------------------------
    def start(self, run, hooks, run_dir) -> None:
        """After `build_run`: the run's membership (collective: the same error on every peer)
        and the algorithm wrapped so that changes can rebuild it."""
        from ..membership.epochs import Membership
        from ..membership.peer import PeerMembership
        from .setup import collectively

        config, comm = self.config, self.comm
        steps = config.epochs * run.steps_per_epoch
        if config.churn is not None:
            membership = collectively(comm, _scheduled, config, comm.topology, steps)
        else:
            membership = Membership(comm.topology)
        self.peer = PeerMembership(comm, membership, join=config.churn_join)
        run.algorithm = self.peer.bind(config.algorithm, run.algorithm)
        if TRANSPORTS.get(config.backend).peer_loss == "detected":
            from ..membership.detected import detected_changes
            from .config import agreement_text

            self.detected = detected_changes(self.peer, comm.transport)
            if self.detected is not None:
                self.detected.steps = steps
                self.detected.config_digest = digest(agreement_text(config)).hex()
        self.run, self.hooks, self.run_dir = run, hooks, run_dir
        if self.rejoining:
            self._await_admission(run)

    def _await_admission(self, run) -> None:
        """A rejoining peer (gossip-train --rejoin): wait until the members admit it, then stand
        at the start of the training epoch of its admission step, away until that step, with a
        new pass over its own shard seeded by (seed, id, admission epoch) (docs: churn)."""
        from ..membership.detected import await_admission

        at = await_admission(self.detected, self.detected.monitor.announce())
        membership = self.peer.membership
        self.placed, self.admitted = at - at % run.steps_per_epoch, at
        self.counted_from = at
        # The epoch before its admission, in which it is not a member. Not the epoch of `placed`:
        # lost after `placed` (in the same training epoch), it would train from `placed` as a
        # member of the group it left; `begin_step` keeps it away until `at` instead.
        self.peer.epoch = membership.at(at - 1)
        self.hooks.on_membership(self.peer.epoch.step, self.peer.epoch.live)
        words = [self.config.seed, self.comm.rank, membership.last.number]
        seed = int(np.random.SeedSequence(words).generate_state(1)[0])
        batches = run.batches.state_dict()
        epoch = self.placed // run.steps_per_epoch
        run.batches.load_state_dict({**batches, "epoch": epoch, "position": 0, "seed": seed})
        print(
            f"membership (rank {self.comm.rank}): admitted at step {at} "
            f"({membership.last.describe()}); away until then",
            flush=True,
        )

    def place(self, state) -> None:
        """Put a rejoining peer's loop at the start of its admission's training epoch."""
        if self.placed is not None:
            state.step = self.placed
            state.epoch = self.placed // self.run.steps_per_epoch

    @property
    def rejoining(self) -> bool:
        """Whether this process rejoins a running run (gossip-train --rejoin)."""
        from ..comm.membership import rejoins

        return rejoins(self.comm)

    @property
    def live(self) -> bool:
        return self.peer is None or self.peer.live

    @property
    def leader(self) -> int:
        """The member that writes the run's shared files (summary): the lowest live id."""
        return min(self.peer.epoch.live) if self.peer is not None else 0

    # ---- every step ------------------------------------------------------------------------------
    def begin_step(self, state) -> bool:
        """Apply the membership of `state.step`; whether this peer trains the step."""
        if self.admitted is not None and state.step < self.admitted:
            return False  # a rejoining peer, placed at its admission's training epoch: away
        run = self.run
        was_live = self.peer.live
        joined = TrainingState(run.model, run.optimizer, state, self)
        if self.detected is not None and was_live:  # (a rejoining peer: from its admission)
            self.detected.before_step(state.step)
        coming = self.peer.membership.at(state.step)
        if coming.number != self.peer.epoch.number:  # the hooks learn it before the change:
            # a leaving holder's trackers hand over before its part in the change's collective
            # (`PeerMembership.advance`), which the next holder waits for before it opens them
            self.hooks.on_membership(coming.step, coming.live)
        change = self.peer.advance(state.step, joined)
        if change is not None and (was_live or self.peer.live):
            self.changes += 1
            self.shift_total += change.shift or 0.0
            if self.transfer_bytes is not None:
                self.transfer_bytes += change.transferred or 0
        if change is not None and self.detected is not None:
            self.detected.continued(change.epoch.number)
        if was_live and not self.peer.live:
            self._write_away(state)
        if not was_live and self.peer.live and self.rejoining:
            print(
                f"membership (rank {self.comm.rank}): handed its state ({self.config.churn_join}) "
                f"at step {state.step}; training",
                flush=True,
            )
        return self.peer.live

    def after_gossip(self, step: int) -> None:
        """Note `step` when its gossip was interrupted (`MemberAlgorithm.step` counts it)."""
        dropped = getattr(self.peer.algorithm, "interrupted_steps", 0)
        if dropped > self._dropped_seen:
            self.interrupted.append(step)
        self._dropped_seen = dropped

    def settle(self, state) -> bool:
        """After the last step (the end of the run): a loss found meanwhile is agreed on by the
        members at `state.step` and takes effect now (`membership.detected`); whether a change
        did. Every member comes here, or to a collective of the end that the loss interrupts."""
        if self.detected is None:
            return False
        self.detected.before_step(state.step)
        membership, changed = self.peer.membership, False
        while self.peer.epoch.number < membership.last.number:
            epoch = membership.epochs[self.peer.epoch.number + 1]
            joined = TrainingState(self.run.model, self.run.optimizer, state, self)
            change = self.peer.advance(epoch.step, joined)
            if change is not None:
                self.changes += 1
                self.detected.continued(change.epoch.number)
                self.hooks.on_membership(change.epoch.step, change.epoch.live)
                changed = True
        return changed

    def guard(self, what: str, fn, *args, **kwargs):
        """`fn(*args, **kwargs)`, a section of the loop with collectives outside the gossip step
        (an evaluation, a log record, a checkpoint's agreement). On torch under on_peer_loss:
        continue, a peer lost during it interrupts it on this member (None, said in one line):
        the others may have finished it, so it is not done again; the next step (or the end's
        `settle`) agrees on going on without the peer, as after an interrupted gossip step."""
        if self.detected is None:
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except PeerLostError as exc:
            print(
                f"membership (rank {self.comm.rank}): {what} interrupted ({exc}): none on this "
                "peer",
                flush=True,
            )
            return None

    def _write_away(self, state) -> None:
        if self.run_dir is None or not self.config.checkpoint_every:
            return
        from .checkpoint import make_header
        from .churn_resume import save_away

        run = self.run
        header = make_header(epoch=state.epoch, step=state.step, **run.header_args)
        payload = state.to_checkpoint(
            model=run.model,
            optimizer=run.optimizer,
            algorithm=run.algorithm,
            batches=run.batches,
            comm=self.comm,
            hooks=self.hooks,
            include_rng=run.owns_process,
        )
        save_away(self.run_dir, header, payload)

    def finish(self) -> None:
        """At the end of the run, on every peer: wait until every peer is done (a peer away at
        the end waits for the members, without deadline, so that the run's lock and files are
        released only when the run is over). On torch, where lost peers are gone: every member
        of the last epoch."""
        if self.detected is None:
            self.comm.rendezvous()
            return
        from ..comm.membership import NO_DEADLINE

        self.detected._store("set", "membership/over", "1")  # no more joins (`await_admission`)
        timeout = self.comm.transport.timeout
        self.comm.transport.timeout = NO_DEADLINE
        try:
            self.comm.barrier()
        finally:
            self.comm.transport.timeout = timeout

    # ---- records and state -----------------------------------------------------------------------
    def on_evaluation(self, record: Dict[str, Any]) -> Dict[str, Any]:
        return {
            "live_peers": len(self.peer.epoch.live),
            "membership_epoch": self.peer.epoch.number,
            "membership_changes": self.changes,
            "average_shift_total": self.shift_total,
        }

    def summary_fields(self) -> Dict[str, Any]:
        """What summary.json adds (collective over the members: the transfer traffic)."""
        dropped = len(self.interrupted)  # checkpointed: a resumed run's steps before it too
        sent = torch.tensor(
            [float(self.comm.stats.transfer_bytes_sent), float(dropped)], dtype=torch.float64
        )
        self.comm.allreduce_(sent, op="sum", metric=True)
        lost = self.detected.changes if self.detected is not None else []
        return {
            "membership_changes": self.changes,
            "live_peers_at_end": len(self.peer.epoch.live),
            "members_at_end": list(self.peer.epoch.live),
            "peers_lost": [
                {
                    "peer": peer,
                    "how": how,
                    "step": change["step"],
                    "detection_to_continuation_s": change["continued"] - change["detected"]
                    if "continued" in change
                    else None,
                }
                for change in lost
                for peer, how in sorted(change["lost"].items())
            ],
            "peers_joined": [
                {"peer": peer, "step": change["step"]}
                for change in lost
                for peer in change.get("joined", ())
            ],
            "average_shift_total": self.shift_total,
            # every change's, summed over its senders (the members' own counters after resuming
            # a checkpoint from before the run's total was kept)
            "transfer_mb_sent": (
                float(sent[0]) if self.transfer_bytes is None else float(self.transfer_bytes)
            )
            / 1e6,
            # member-steps, not steps: each member's steps whose gossip a lost peer interrupted,
            # summed over the members at the end (torch; docs/concepts/churn.md says so)
            "gossip_steps_dropped": int(sent[1]),
            "churn": self.config.churn,
        }

    def exact_messages(self, rounds: int, every: int) -> Optional[int]:
        """The models exact gossip would have had this peer send over communication rounds
        0..rounds-1 (round t after training step (t+1) x every - 1): in each round its traffic
        counters cover (from `counted_from`) and it was a member in, its neighbours in the graph
        in force then (its epoch's, at round t on a schedule); none in a round whose gossip a lost
        peer interrupted on it (`interrupted`: an exchange that did not finish counts no byte
        sent, so exact gossip's ratio stays 1). None when the membership never changed (the
        run's own graph throughout: `report` counts as without churn)."""
        membership, me = self.peer.membership, self.comm.rank
        epochs = membership.epochs
        if len(epochs) == 1:
            return None
        dropped = {step // every for step in self.interrupted}
        total = 0
        for epoch, end in zip(epochs, [e.step for e in epochs[1:]] + [rounds * every]):
            first = max(epoch.step, self.counted_from) // every
            span = range(first, min(end // every, rounds))
            if me not in epoch or not span:
                continue
            graph = membership.graph(epoch)
            if graph.period == 1:
                kept = len(span) - sum(1 for t in dropped if t in span)
                total += kept * len(graph.at(0).neighbors(me))
            else:
                total += sum(len(graph.at(t).neighbors(me)) for t in span if t not in dropped)
        return total

    def state_dict(self) -> Dict[str, Any]:
        return {
            "changes": self.changes,
            "shift_total": self.shift_total,
            "counted_from": self.counted_from,
            "transfer_bytes": self.transfer_bytes,
            "interrupted": list(self.interrupted),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.changes, self.shift_total = int(state["changes"]), float(state["shift_total"])
        self.counted_from = int(state.get("counted_from", 0))  # (checkpoints from before it)
        self.transfer_bytes = state.get("transfer_bytes")  # None: from before it was kept
        self.interrupted = [int(step) for step in state.get("interrupted", ())]  # (... before it)


def call(what: str, fn, *args, **kwargs):
    """`ChurnRun.guard` of a run without churn: `fn(*args, **kwargs)`."""
    return fn(*args, **kwargs)


def churn_run(comm: Comm, config) -> Optional[ChurnRun]:
    """The membership driver of a run with on_peer_loss: continue, else None."""
    if config.on_peer_loss != "continue":
        return None
    return ChurnRun(comm, config)
