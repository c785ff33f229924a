"""The torch transport of a process that rejoins a running run: `gossip-train --rejoin ID`.

A process started with the stable id of a peer the members removed (under ``on_peer_loss:
continue``; `membership.detected`) cannot join the run's default group: its peers hold theirs,
built at set-up. So `RejoiningCommunicator` (the transport's choice once `rejoin_as(ID)` was
called) reaches the rendezvous store like any rank, checks the topology and the device against
rank 0's set-up entry in it, hands its liveness monitor every peer's set-up announcement (its own
new one in its place) and builds no group: until the members admit it, it is alone (`SoloGroup`:
the collectives of its set-up, such as the config check, are over itself) and its monitor watches
no peer. Its first group is its admission epoch's (`torch_members.MemberGroup`), built when
`membership.peer.PeerMembership.advance` applies that epoch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List, Optional

from ..errors import CommunicationError
from .base import digest
from .torch import TorchCommunicator
from .torch_members import end_helpers

if TYPE_CHECKING:
    from topologies import Topology

__all__ = ["RejoiningCommunicator", "SoloGroup", "rejoin_as", "rejoining"]

_rejoining: Optional[int] = None


def rejoin_as(peer: Optional[int]) -> None:
    """Make the torch communicator this process builds next that of peer `peer` rejoining a
    running run (`gossip-train --rejoin ID`); None: an ordinary one."""
    global _rejoining
    _rejoining = peer


def rejoining() -> Optional[int]:
    """The peer id this process rejoins as (`rejoin_as`), else None."""
    return _rejoining


class SoloGroup:
    """A rejoining peer's group until its admission: itself alone (it talks to no other peer)."""

    number = -1

    def __init__(self, rank: int):
        self.live = (rank,)
        self.position = {rank: 0}

    def _nobody(self, tensor, peer: int):
        raise CommunicationError(
            f"rank {self.live[0]}: a rejoining peer talks to peer {peer} before the members "
            "admitted it (an operation of the training loop before its admission step)"
        )

    send = recv = _nobody

    def allgather_bytes(self, data: bytes, post, wait) -> List[bytes]:
        return [data]


class RejoiningCommunicator(TorchCommunicator):
    """`TorchCommunicator` of a rejoining process (module docstring)."""

    _rejoined = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = SoloGroup(self.rank)

    def _agree_before_joining(self, topology: Topology, world_size: int, device) -> None:
        """In place of the set-up agreement: check the run's, take in its announcements."""
        store, rank = self._store, self.rank
        self._owns_group = False  # no default group of its own (its peers hold theirs)
        if not store.check(["hello/0"]):
            raise CommunicationError(
                f"rank {rank}: --rejoin found no running run at {os.environ.get('MASTER_ADDR')}:"
                f"{os.environ.get('MASTER_PORT')} (the store holds no set-up): start the run first"
            )
        keys = [f"hello/{k}" for k in range(world_size)]
        hellos = [store.get(k).decode().split("|") if store.check([k]) else [] for k in keys]
        mine = digest(f"{topology.size}:{topology.fingerprint}").hex()
        if hellos[0][0] != mine or hellos[0][1] != device.type:
            raise CommunicationError(
                f"rank {rank}: --rejoin: the running run's topology or device differs from this "
                "process's config: rejoin with the run's own config"
            )
        monitor = self._monitor
        if monitor is not None:
            announcements = [bytes.fromhex(h[2]) if len(h) == 3 else b"" for h in hellos]
            announcements[rank] = monitor.announce()
            if all(announcements):
                monitor.join(announcements, self.timeout)
            monitor.resting = True  # it watches no peer until admitted (`await_admission`)

    def _ring_members(self):
        if isinstance(self.group, SoloGroup):  # before its admission: alone
            return self.group.live
        return super()._ring_members()

    def _close_at_exit(self) -> None:
        end_helpers(self)  # the waits left pending on its members' groups (it has no default one)
        super()._close_at_exit()
        self.group = None  # its only groups are the members' (`torch_members.MemberGroup`)
