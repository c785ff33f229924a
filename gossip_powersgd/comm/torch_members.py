"""The torch transport of a run whose peers may be lost (``on_peer_loss: continue``).

Two things `TorchCommunicator` needs once a lost peer must not end the run:

* **Waits that a loss interrupts.** A gloo receive from a peer that is stopped or cut off blocks
  until the comm timeout, and a gloo wait that times out closes every connection of its group. So
  each wait runs in a helper thread, and the caller looks every `POLL_SECONDS` at `interrupted()`
  (the membership's: a loss this rank's monitor found, or one the other survivors wrote in the
  store); when it says a peer is lost, the operation is abandoned with `PeerLostError`, without
  touching the group's connections. A receive from a peer that died (its connections reset) fails
  at once, and so does posting a message on a connection gloo has already closed ("Connection
  closed by peer", raised by the post itself, not by a wait): the monitor's diagnosis of either
  goes to the same place (`raise_if_lost`).
* **A group per membership epoch.** The default group holds every peer of the launch, and its
  connections to a lost one are broken. After each agreed change the members build a fresh gloo
  group over themselves (`MemberGroup`: a `ProcessGroupGloo` on a `PrefixStore` of the rendezvous
  store, one per epoch number, collective over the members only); its ranks are positions in the
  ascending list of member ids, so peer ids (which never change) are mapped to positions here.

CPU tensors only (gloo): a run with ``device: cuda`` (or ``auto`` on a machine with CUDA) and
on_peer_loss: continue is refused.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

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


#: (helper thread, the group its work is on: a `MemberGroup`, or None for the default group, the
#: time.monotonic() by which its wait times out) of every `watched_wait` whose helper may still
#: run (`end_helpers`).
_helpers: List[Tuple[threading.Thread, Optional["MemberGroup"], float]] = []


def watched_wait(work, seconds: float, interrupted: Callable[[], Optional[str]], group=None):
    """`work.wait(seconds)`, in a helper thread; raises `PeerLostError` as soon as
    `interrupted()` names a loss (the helper is left to end with the work: when the lost peer's
    connections close, when `close_pending` closes the group's at the change, or at the latest
    when the process leaves its groups, `end_helpers`). `group`: the work's (None: default)."""
    done, box = threading.Event(), {}

    def wait() -> None:
        try:
            box["finished"] = work.wait(datetime.timedelta(seconds=seconds))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            done.set()

    helper = threading.Thread(target=wait, name="gossip-wait", daemon=True)
    helper.start()
    _helpers[:] = [h for h in _helpers if h[0].is_alive()]
    _helpers.append((helper, group, time.monotonic() + seconds))
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
    """After a wait for `peers` failed or timed out: under continue, `PeerLostError` if the
    monitor's diagnosis (`faults.Monitor.diagnose`) or the membership finds a lost peer within the
    time the monitor takes to find one (`Monitor.finding_seconds`, DYING_SECONDS at least); else
    nothing (the caller raises the failure). Not only DYING_SECONDS: a wait times out, or fails
    because a neighbour's timed out and closed its connections, before the monitors find the
    peer behind it when a loaded machine pauses them (a link cut in the churn soak ended two
    neighbours of the cut host so, and a third waited for them in vain)."""
    if interrupted is None or monitor is None:
        return
    deadline = time.monotonic() + max(DYING_SECONDS, monitor.finding_seconds())
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


def end_helpers(comm: "TorchCommunicator") -> None:
    """Before the process leaves its groups (every member is done with them): end every helper
    of `watched_wait` still blocked, by closing its group's connections (`close_pending`), and
    wait for it: DYING_SECONDS, then (a helper that a loaded machine has not run yet, or one
    that closing did not reach) until its own wait times out. A helper whose wait returns while
    the interpreter is finalizing aborts the process ("terminate called without an active
    exception": its thread can no longer take the interpreter's lock); one still blocked when
    the C++ runtime tears down its groups crashes it."""
    alive = [h for h in _helpers if h[0].is_alive()]
    if not alive:
        return
    size = getattr(comm, "largest_receive", 1)
    for group in {id(g): g for _, g, _ in alive}.values():
        if group is not None:
            close_pending(group.recv, [j for j in group.live if j != comm.rank], size)
        elif dist.is_initialized():
            close_pending(dist.irecv, [j for j in range(comm.size) if j != comm.rank], size)
    soon = time.monotonic() + DYING_SECONDS
    for helper, _, times_out in alive:
        helper.join(max(max(soon, times_out + DYING_SECONDS) - time.monotonic(), 0.0))
    _helpers[:] = [h for h in _helpers if h[0].is_alive()]


class GroupNotBuilt(CommunicationError):
    """A membership epoch's group that not every member joined; `absent`: the ones that did
    not (empty if the store does not tell)."""

    def __init__(self, text: str, absent: List[int]):
        super().__init__(text)
        self.absent = absent


class MemberGroup:
    """The gloo group of membership epoch `number` over the peers `live` (module docstring)."""

    def __init__(self, store, number: int, live: Sequence[int], rank: int, timeout: float):
        self.number, self.rank = number, rank
        self.live = tuple(sorted(live))
        self.position: Dict[int, int] = {peer: k for k, peer in enumerate(self.live)}
        prefix = dist.PrefixStore(f"membership/group/{number}/", store)
        try:
            self.group = dist.ProcessGroupGloo(
                prefix, self.position[rank], len(self.live), datetime.timedelta(seconds=timeout)
            )
        except RuntimeError as exc:  # DistStoreError: not every member came within `timeout`
            # gloo's rendezvous: each member posts its address under "0/<position>"
            absent = [p for p in self.live if not prefix.check([f"0/{self.position[p]}"])]
            who = f"peer(s) {absent}" if absent else f"a member of {list(self.live)}"
            raise GroupNotBuilt(
                f"rank {rank}: {who} did not join the group of membership epoch {number} within "
                f"{timeout:g} s (a peer lost while the members switch groups ends the run in "
                "this version)",
                absent,
            ) from exc

    def send(self, tensor, peer: int):
        return self.group.send([tensor], self.position[peer], 0)

    def recv(self, tensor, peer: int):
        return self.group.recv([tensor], self.position[peer], 0)

    def allgather_bytes(self, data: bytes, post, wait) -> List[bytes]:
        """Every member's `data` (of one length), in id order; `post(...)` and `wait(works,
        ...)` the transport's."""
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [[torch.empty_like(mine) for _ in self.live]]
        what = "an all-gather with the members"
        others = [k for k in self.live if k != self.rank]
        work = post(lambda: self.group.allgather(out, [mine]), what, [], others)
        wait([work], [], what, others)
        return [bytes(t.numpy().tobytes()) for t in out[0]]


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
    "GroupNotBuilt",
    "MemberGroup",
    "before_transfer",
    "POLL_SECONDS",
    "close_pending",
    "end_helpers",
    "next_group",
    "raise_if_lost",
    "watched_wait",
]
