"""What a rank can observe about its peers' processes: the signals `monitor` turns into events.

Standard library only: it runs before torch or MPI is imported, since a rank's set-up (MPI_Init,
the rendezvous) is where a stopped peer used to hold every other rank for minutes. `PeerLost` is
the one event `monitor` makes of them.

* **Process states** (peers of this machine). /proc/PID/stat says "T" while a process is stopped
  (SIGSTOP, Ctrl-Z), and a stopped process runs nothing at all, however long one waits; a slow
  process is "R", "S" or "D", never "T". So the kernel, not a deadline, tells stopped from slow. A
  process held by a debugger is "t" (traced) and is left alone.
* **The ranks of this machine before any communicator**: a launcher's workers are its children
  (torchrun's agent, MPICH's hydra_pmi_proxy), each with its rank in its environment, so a rank
  finds its siblings in /proc without exchanging a byte. Under the rank supervisor (`supervisor`)
  a rank is the supervisor's child, which carries `SUPERVISOR_VAR`.
* **Heartbeats** (every peer): one datagram of `HEARTBEAT_BYTES` raw bytes (never pickle) per peer
  and period. Peers of this machine are reached through abstract unix sockets named after their
  launcher and rank (nothing to agree on, nothing left on disk, one namespace per network
  namespace, so per host); peers of other machines by UDP, at the addresses agreed at set-up.
* **Probes**: every rank listens on a TCP port (nothing is ever read from it). A connection to it
  completes while the peer's host runs its kernel, even with the peer stopped; it is refused once
  the peer's process has ended; it gets no answer from a host that is cut off or down.
"""

from __future__ import annotations

import errno
import hashlib
import os
import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

#: What the user is told about a stopped peer (the same words on every transport).
STOPPED_HOW = "stopped (SIGSTOP or Ctrl-Z: its process state is T)"
#: The environment variable that marks a rank run by `supervisor` (its value: the supervisor's pid).
SUPERVISOR_VAR = "GOSSIP_POWERSGD_SUPERVISOR"
#: The launchers' rank and size variables, in the order they are read.
RANK_VARS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))
TORCHRUN_VARS = ("RANK", "WORLD_SIZE")


# ---- the event -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerLost:
    """Peer `peer` is lost: how, on which host, after how many seconds; `told_by` is the rank that
    saw it when this one only heard of it; `others` the peers an isolated rank lost with it."""

    peer: int
    how: str
    host: str
    seconds: float = 0.0
    told_by: Optional[int] = None
    others: Tuple[int, ...] = ()

    def text(self) -> str:
        p, host, s = self.peer, self.host, f"{self.seconds:g}"
        if self.how == "stopped":
            text = f"peer {p} has been {STOPPED_HOW}{f' for {s} s' if self.seconds else ''}"
            text += f", on host {host}"
        elif self.how == "killed":
            text = (
                f"peer {p} on host {host} is gone: its process ended without a word (killed: "
                "kill -9, the OOM killer?)"
            )
        elif self.how == "failed":  # told by the peer itself, as it ends (`faults.fail`)
            return f"peer {p} on host {host} ended with an error (its own line says which)"
        elif self.how == "hung":
            text = (
                f"peer {p} on host {host} sent no heartbeat for {s} s though its host answers: "
                "it is stopped or hung"
            )
        elif self.how == "unreachable":
            text = (
                f"peer {p} on host {host} is unreachable: "
                f"{f'no heartbeat for {s} s and ' if self.seconds else ''}its host does not "
                "answer (link down, or host down?)"
            )
        elif self.seconds:
            text = (
                f"no peer on another host has answered for {s} s ({_peers((p, *self.others))}): "
                f"this host, {host}, may be the one cut off (its link down?), or they are all down"
            )
        else:
            text = (
                f"this host, {host}, has no route to its peers on other hosts "
                f"({_peers((p, *self.others))}): its link is down"
            )
        return text if self.told_by is None else f"{text} (seen by rank {self.told_by})"


def _peers(peers: Sequence[int]) -> str:
    return f"peer {peers[0]}" if len(peers) == 1 else f"peers {', '.join(map(str, peers))}"


# ---- processes -----------------------------------------------------------------------------------
def process_key() -> bytes:
    """8 bytes equal for two processes of one host: the same host name, boot, pid namespace (so a
    pid names the same process in both; containers each have their own) and network namespace (so
    they reach each other's abstract unix sockets; hosts emulated by namespaces each have one)."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
        parts.append(str(os.stat("/proc/self/ns/net").st_ino))
    except OSError:
        return bytes(8)  # no /proc: never "the same machine", so nothing is looked at
    return hashlib.sha256("|".join(parts).encode()).digest()[:8]


def _stat(pid: int) -> Optional[List[str]]:
    """The fields of /proc/PID/stat after the command name (state first), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_state(pid: int) -> Optional[str]:
    """The one-letter state of process `pid` ("R", "S", "T", "Z", ...), or None if it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def is_stopped(pid: int) -> bool:
    return process_state(pid) == "T"


def is_gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


def parent_of(pid: int) -> Optional[int]:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def environ_of(pid: int) -> Dict[str, str]:
    """The environment process `pid` started with ({} if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in items if b"=" in item)
    return {key: value for key, _, value in pairs}


def children_of(pid: int) -> List[int]:
    """The child processes of `pid`."""
    found: List[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        return found
    except OSError:  # a kernel without /proc/PID/task/TID/children: look at every process
        pass
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit() and parent_of(int(name)) == pid:
            found.append(int(name))
    return found


def launched_rank(env=None) -> Optional[Tuple[int, int]]:
    """(rank, world size) set by mpiexec or torchrun in `env` (default: ours), else None (also for
    values that are no integers or a rank outside 0..size-1)."""
    env = os.environ if env is None else env
    for rank_var, size_var in (*RANK_VARS, TORCHRUN_VARS):
        if rank_var in env and size_var in env:
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
            except ValueError:
                return None
            # a rank out of range is no launcher's: the transport names it in one line
            return (rank, size) if 0 <= rank < size else None
    return None


def launcher_pid() -> int:
    """The process that started this rank and its siblings (the supervisor's parent if supervised)."""
    parent = os.getppid()
    if os.environ.get(SUPERVISOR_VAR) == str(parent):
        return parent_of(parent) or parent
    return parent


def sibling_ranks(launcher: int, own_pid: int) -> Dict[int, int]:
    """{rank: pid} of the other ranks `launcher` started on this machine (each one's supervised
    child where it has one: the process that trains)."""
    found: Dict[int, int] = {}
    for child in children_of(launcher):
        env = environ_of(child)
        rank = launched_rank(env)
        if rank is None:
            continue
        pid = child
        for grandchild in children_of(child):
            if environ_of(grandchild).get(SUPERVISOR_VAR) == str(child):
                pid = grandchild
        if pid != own_pid and child != own_pid:
            found[rank[0]] = pid
    return found


# ---- addresses -------------------------------------------------------------------------------------
def route_address(target: str) -> Optional[str]:
    """This machine's address on the route to `target` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(target), 9))
            return s.getsockname()[0]
    except OSError:
        return None


def local_addresses() -> List[str]:
    """The IPv4 addresses of this machine's interfaces that are up, loopback excluded."""
    import fcntl

    found: List[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # SIOCGIFADDR: no IPv4 address on it
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127.") and address not in found:
                found.append(address)
    return found


# ---- heartbeats ----------------------------------------------------------------------------------
#: A heartbeat: magic, version, flags, how (of `lost`), sender, job token, sequence, lost peer (-1:
#: none) and for how many seconds it was seen so.
_HEARTBEAT = struct.Struct("!4sBBBxIIIiH")
HEARTBEAT_BYTES = _HEARTBEAT.size
_MAGIC = b"GPHB"
#: Flags: the sender ends cleanly (its silence from now on is no fault); it has told its user.
LEAVING, SPOKEN = 1, 2


def pack_heartbeat(
    sender: int, token: int, seq: int, flags: int, lost: int, how: int, seconds: int
) -> bytes:
    seconds = min(max(int(seconds), 0), 65535)
    return _HEARTBEAT.pack(_MAGIC, 1, flags, how, sender, token, seq & 0xFFFFFFFF, lost, seconds)


def unpack_heartbeat(data: bytes) -> Optional[Tuple[int, ...]]:
    """(sender, token, seq, flags, lost, how, seconds), or None for anything that is not ours."""
    if len(data) != HEARTBEAT_BYTES:
        return None
    magic, version, flags, how, sender, token, seq, lost, seconds = _HEARTBEAT.unpack(data)
    if magic != _MAGIC or version != 1:
        return None
    return sender, token, seq, flags, lost, how, seconds


class Endpoint:
    """This rank's three sockets (see the module docstring). Never blocks on a send."""

    def __init__(self, launcher: int, rank: int):
        self.launcher = launcher
        self.local = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.local.bind(self.local_name(rank))
        except OSError:  # another job's rank of the same launcher pid (after a pid wrap): no
            self.local.bind("")  # local heartbeats for this one, /proc states still work
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", 0))
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("0.0.0.0", 0))
        self.listener.listen(128)
        for s in (self.local, self.udp, self.listener):
            s.setblocking(False)
        self.udp_port = self.udp.getsockname()[1]
        self.probe_port = self.listener.getsockname()[1]

    def local_name(self, rank: int) -> bytes:
        return f"\0gossip_powersgd/{self.launcher}/{rank}".encode()

    def send_local(self, rank: int, data: bytes) -> None:
        try:
            self.local.sendto(data, self.local_name(rank))
        except OSError:  # not bound yet (still starting) or gone: its state says which
            pass

    def send_udp(self, address: Tuple[str, int], data: bytes) -> None:
        try:
            self.udp.sendto(data, address)
        except OSError:  # no route (a cut link), a full buffer: silence is what counts
            pass

    def wait(self, seconds: float) -> List[Tuple[bytes, Optional[Tuple[str, int]]]]:
        """Wait up to `seconds` for datagrams; return (data, UDP source or None for local) of all."""
        try:
            ready = select.select([self.local, self.udp, self.listener], [], [], seconds)[0]
        except (OSError, ValueError):
            return []
        received: List[Tuple[bytes, Optional[Tuple[str, int]]]] = []
        for s in ready:
            if s is self.listener:
                self._drop_probes()
                continue
            while True:
                try:
                    data, source = s.recvfrom(64)
                except OSError:
                    break
                received.append((data, source if s is self.udp else None))
        return received

    def _drop_probes(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            connection.close()

    def close(self) -> None:
        for s in (self.local, self.udp, self.listener):
            s.close()


#: A reset before the connection was seen made: the listener closed with it in its queue.
_OUTCOMES = {
    errno.ECONNREFUSED: "refused",
    errno.ECONNRESET: "refused",
    errno.ENETUNREACH: "noroute",
}


def probe(
    targets: Iterable[Tuple[int, str, int]], seconds: float, settle: float = 1.0
) -> Dict[int, str]:
    """Connect to each (peer, address, port) at once; {peer: outcome} within `seconds`:

    alive     the peer's monitor accepted the connection and closed it (within `settle` s)
    answers   its host completed the connection but nobody accepted it: stopped or hung
    refused   nothing listens there, or the listener closed under the connection: the peer's
              process has ended (a process dying closes its connections before its listener, so
              a probe sent on a closed connection may still get in, and then be reset)
    silent    no answer: its host is cut off or down
    noroute   this host has no route there: its own link is down
    """
    connecting: Dict[socket.socket, int] = {}
    connected: Dict[socket.socket, int] = {}
    outcome: Dict[int, str] = {}
    for peer, address, port in targets:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        code = s.connect_ex((address, port))
        if code in (0, errno.EINPROGRESS):
            connecting[s] = peer
        else:
            outcome[peer] = _OUTCOMES.get(code, "silent")
            s.close()
    deadline = time.monotonic() + seconds
    settled: Dict[socket.socket, float] = {}
    while (connecting or connected) and time.monotonic() < deadline:
        wait = min([deadline, *settled.values()]) - time.monotonic()
        readable, writable, _ = select.select(list(connected), list(connecting), [], max(wait, 0))
        for s in writable:
            code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            peer = connecting.pop(s)
            if code == 0:
                connected[s], settled[s] = peer, time.monotonic() + settle
            else:
                outcome[peer] = _OUTCOMES.get(code, "silent")
                s.close()
        for s in readable:
            try:
                outcome[connected[s]] = "alive" if s.recv_into(bytearray(1)) == 0 else "answers"
            except OSError:  # reset: the listener went away with its process
                outcome[connected[s]] = "refused"
            del connected[s]
            s.close()
        now = time.monotonic()
        for s in [s for s in connected if settled[s] <= now]:
            outcome[connected.pop(s)] = "answers"
            s.close()
    for s, peer in [*connecting.items(), *connected.items()]:
        outcome[peer] = "silent" if s in connecting else "answers"
        s.close()
    return outcome


def probe_addresses(
    targets: Dict[int, Tuple[Sequence[str], int]], seconds: float
) -> Dict[int, Tuple[str, str]]:
    """`probe` every address of each peer ({peer: (addresses, port)}) at once; {peer: (outcome,
    address)}: "alive" if any address is, else "answers" if any does, else its first address's."""
    keyed = {
        (peer, address): port
        for peer, (addresses, port) in targets.items()
        for address in addresses
    }
    keys = list(keyed)
    outcome = probe([(k, key[1], keyed[key]) for k, key in enumerate(keys)], seconds)
    found: Dict[int, Tuple[str, str]] = {}
    for wanted in ("alive", "answers", None):
        for k, (peer, address) in enumerate(keys):
            if peer not in found and wanted in (None, outcome[k]):
                found[peer] = (outcome[k], address)
    return found


__all__ = [
    "STOPPED_HOW",
    "PeerLost",
    "SUPERVISOR_VAR",
    "HEARTBEAT_BYTES",
    "LEAVING",
    "SPOKEN",
    "Endpoint",
    "children_of",
    "environ_of",
    "is_gone",
    "is_stopped",
    "launched_rank",
    "launcher_pid",
    "local_addresses",
    "pack_heartbeat",
    "parent_of",
    "probe",
    "probe_addresses",
    "process_key",
    "process_state",
    "route_address",
    "sibling_ranks",
    "unpack_heartbeat",
]
