"""The torch transport of a run whose peers may be lost (``on_peer_loss: continue``).

Two things `TorchCommunicator` needs once a lost peer must not end the run:

* **Waits that a loss interrupts.** A gloo receive from a peer that is stopped or cut off blocks
  until the comm timeout, and a gloo wait that times out closes every connection of its group. So
  each wait runs in a helper thread, and the caller looks every `POLL_SECONDS` at `interrupted()`
  (the membership's: a loss this rank's monitor found, or one the other survivors wrote in the
  store); when it says a peer is lost, the operation is abandoned with `PeerLostError`, without
  touching the group's connections. A receive from a peer that died (its connections reset) fails
  at once, and the monitor's diagnosis of it goes to the same place.
* **A group per membership epoch.** The default group holds every peer of the launch, and its
  connections to a lost one are broken. After each agreed change the members build a fresh gloo
  group over themselves (`MemberGroup`: a `ProcessGroupGloo` on a `PrefixStore` of the rendezvous
  store, one per epoch number, collective over the members only); its ranks are positions in the
  ascending list of member ids, so peer ids (which never change) are mapped to positions here.

* **A peer that comes back** (`gossip-train --rejoin ID`, `rejoin_as`): a process started with the
  stable id of a peer the members removed joins no default group (its peers hold theirs); it
  reaches the rendezvous store, checks the topology and device against rank 0's set-up entry,
  hands its liveness announcement to its monitor with the others', and is alone (`SoloGroup`:
  its set-up's collectives are over itself) until the members admit it
  (`membership.detected`); its first group is the one of its admission epoch.

CPU tensors only (gloo): a run with ``device: cuda`` and on_peer_loss: continue is refused.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from ..errors import CommunicationError, PeerLostError

if TYPE_CHECKING:  # the torch communicator itself imports this module: typed by its base
    from .base import Communicator as TorchCommunicator

#: How often a wait looks whether a peer was found lost meanwhile.
POLL_SECONDS = 0.05
#: How long a failed wait looks for a lost peer behind it: a connection reset by a killed peer
#: arrives while its process is still ending, before /proc or a probe can tell.
DYING_SECONDS = 3.0
#: Receives `close_pending` posts per peer at most (each one that completes took a stale message).
CLOSE_TRIES = 4
_INSTANT = datetime.timedelta(milliseconds=1)


def watched_wait(work, seconds: float, interrupted: Callable[[], Optional[str]]):
    """`work.wait(seconds)`, in a helper thread; raises `PeerLostError` as soon as
    `interrupted()` names a loss (the helper is left to end with the work: when the lost peer's
    connections close, or when `close_pending` closes the group's at the change)."""
    done, box = threading.Event(), {}

    def wait() -> None:
        try:
            box["finished"] = work.wait(datetime.timedelta(seconds=seconds))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=wait, name="gossip-wait", daemon=True).start()
    while not done.wait(POLL_SECONDS):
        reason = interrupted()
        if reason is not None:
            raise PeerLostError(reason)
    if "error" in box:
        raise box["error"]
    return box["finished"]


def before_transfer(comm: "TorchCommunicator", incoming) -> None:
    """Before `comm` (a `TorchCommunicator`) posts a transfer: `PeerLostError` once a peer is
    lost (nothing more on the current group); the largest receive so far (`close_pending`'s)."""
    if comm.interrupted is None:
        return
    reason = comm.interrupted()
    if reason is not None:
        raise PeerLostError(reason)
    sizes = [buffer.numel() * buffer.element_size() for _, buffer in incoming]
    comm.largest_receive = max([getattr(comm, "largest_receive", 1), *sizes])


def raise_if_lost(monitor, peers, interrupted: Optional[Callable[[], Optional[str]]]) -> None:
    """After a wait for `peers` failed: under continue, `PeerLostError` if the monitor's diagnosis
    (`faults.Monitor.diagnose`) or the membership finds a lost peer within DYING_SECONDS; else
    nothing (the caller raises the failure)."""
    if interrupted is None or monitor is None:
        return
    deadline = time.monotonic() + DYING_SECONDS
    while True:
        monitor.diagnose(peers)
        reason = interrupted()
        if reason is not None:
            raise PeerLostError(reason) from None
        if time.monotonic() > deadline:
            return
        time.sleep(POLL_SECONDS)


def close_pending(recv, peers: Sequence[int], size: int) -> None:
    """End every wait still pending on a group this rank leaves (`recv(buffer, peer)` posts a
    receive on it): a receive that times out at once makes gloo close the connection, and every
    wait on it ends with an error now, not at the comm timeout. (A helper of `watched_wait` still
    blocked in gloo when the interpreter exits aborts the process: "terminate called".) A
    receive that completes took a message sent before the change that nobody waits for: `size`
    bytes, the largest receive so far, hold any (a larger message aborts gloo)."""
    for peer in peers:
        for _ in range(CLOSE_TRIES):
            try:
                if recv(torch.zeros(size, dtype=torch.uint8), peer).wait(_INSTANT) is False:
                    break
            except RuntimeError:  # the timeout, or a connection closed already
                break


class MemberGroup:
    """The gloo group of membership epoch `number` over the peers `live` (module docstring)."""

    def __init__(self, store, number: int, live: Sequence[int], rank: int, timeout: float):
        self.number = number
        self.live = tuple(sorted(live))
        self.position: Dict[int, int] = {peer: k for k, peer in enumerate(self.live)}
        prefix = dist.PrefixStore(f"membership/group/{number}/", store)
        self.group = dist.ProcessGroupGloo(
            prefix, self.position[rank], len(self.live), datetime.timedelta(seconds=timeout)
        )

    def send(self, tensor, peer: int):
        return self.group.send([tensor], self.position[peer], 0)

    def recv(self, tensor, peer: int):
        return self.group.recv([tensor], self.position[peer], 0)

    def allgather_bytes(self, data: bytes, wait) -> List[bytes]:
        """Every member's `data` (of one length), in id order; `wait(works, ...)` the transport's."""
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [[torch.empty_like(mine) for _ in self.live]]
        wait([self.group.allgather(out, [mine])], [], "an all-gather with the members")
        return [bytes(t.numpy().tobytes()) for t in out[0]]


_rejoining: Optional[int] = None


def rejoin_as(peer: Optional[int]) -> None:
    """Make the communicator this process builds next that of peer `peer` rejoining a running
    run (`gossip-train --rejoin ID`); None: an ordinary one."""
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

    def allgather_bytes(self, data: bytes, wait) -> List[bytes]:
        return [data]


def join_running(comm: "TorchCommunicator", topology, device) -> None:
    """The set-up of a rejoining `comm` (module docstring): the topology and the device type must
    be rank 0's (its entry in the store, from the run's set-up); the liveness monitor takes in
    every peer's announcement of that set-up, this process's own new one in its place."""
    from .base import digest

    store, rank = comm._store, comm.rank
    if not store.check(["hello/0"]):
        raise CommunicationError(
            f"rank {rank}: --rejoin found no running run at {os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')} (the store holds no set-up): start the run first"
        )
    keys = [f"hello/{k}" for k in range(topology.size)]
    hellos = [store.get(k).decode().split("|") if store.check([k]) else None for k in keys]
    mine = digest(f"{topology.size}:{topology.fingerprint}").hex()
    if hellos[0][0] != mine or hellos[0][1] != device.type:
        raise CommunicationError(
            f"rank {rank}: --rejoin: the running run's topology or device differs from this "
            "process's config: rejoin with the run's own config"
        )
    monitor = comm._monitor
    if monitor is not None:
        announcements = [bytes.fromhex(h[2]) if h and len(h) == 3 else b"" for h in hellos]
        announcements[rank] = monitor.announce()
        if all(announcements):
            monitor.join(announcements, comm.timeout)
        monitor.resting = True  # it watches no peer until admitted (`await_admission`)


def next_group(comm: "TorchCommunicator", number: int, live: Sequence[int]) -> MemberGroup:
    """The group of membership epoch `number` for the `TorchCommunicator` `comm`, after ending
    every wait left pending on its current one (the default group in epoch 0)."""
    size = getattr(comm, "largest_receive", 1)
    if comm.group is not None:
        close_pending(comm.group.recv, [j for j in comm.group.live if j != comm.rank], size)
    else:
        close_pending(dist.irecv, [j for j in range(comm.size) if j != comm.rank], size)
    return MemberGroup(comm._store, number, live, comm.rank, comm.timeout)


__all__ = [
    "MemberGroup",
    "SoloGroup",
    "join_running",
    "rejoin_as",
    "rejoining",
    "before_transfer",
    "POLL_SECONDS",
    "close_pending",
    "next_group",
    "raise_if_lost",
    "watched_wait",
]
