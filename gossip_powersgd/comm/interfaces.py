"""Which network interface gloo binds to, found from the route to the rendezvous host.

Unless GLOO_SOCKET_IFNAME says otherwise, gloo binds to the address this machine's hostname
resolves to, and falls back to loopback when it resolves to none of its own: on many machines the
hostname is written in /etc/hosts as 127.0.1.1 (Debian's default), so peers on other machines are
told to connect to a loopback address and the group never forms. The interface that carries
traffic to MASTER_ADDR is one every peer can reach this one on (they all reach MASTER_ADDR), so
`bind_gloo_to_route` names it in GLOO_SOCKET_IFNAME before the group is made, unless the user set
it; on MASTER_ADDR's own host, where that name may resolve to loopback, it takes the interface
towards a rank on another host instead (published in the rendezvous store). IPv4 on Linux;
elsewhere it leaves gloo to its default.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import struct
from typing import Optional

_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface
#: The interface this process chose last (a later group chooses again; a user's setting stands).
_chosen: Optional[str] = None


def _ipv4_address(name: str) -> Optional[str]:
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return None
    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(reply[20:24])


def source_address(host: str) -> Optional[str]:
    """The IPv4 address the kernel picks as the source to reach `host` (a name or an address), or
    None where it cannot tell (no IPv4 route, an unresolvable name)."""
    try:
        target = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))  # UDP: picks a route and a source address, sends nothing
            return probe.getsockname()[0]
    except OSError:
        return None


def interface_towards(host: str) -> Optional[str]:
    """The name of this machine's interface that holds the source address to reach `host`: "lo"
    for a loopback address; None where unknown."""
    source = source_address(host)
    if source is None:
        return None
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        if _ipv4_address(name) == source:
            return name
    return None


def _is_loopback(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def bind_gloo_to_route(store, rank: int, world_size: int, master_addr: str, timeout: float):
    """Set GLOO_SOCKET_IFNAME, unless it is set, to the interface the other ranks reach this one
    on; returns the interface gloo will use (None: gloo's own choice). Collective over the
    rendezvous `store` (every rank publishes its source address towards `master_addr`).

    That is the interface towards `master_addr`, except where `master_addr` resolves to a loopback
    address here (rank 0's host, when its hostname is written as 127.0.1.1): then the interface
    towards a rank that reaches the master from another host. Where every rank is on this host,
    loopback is right."""
    global _chosen
    if os.environ.get("GLOO_SOCKET_IFNAME") not in (None, "", _chosen):
        return os.environ["GLOO_SOCKET_IFNAME"]  # the user's
    mine = source_address(master_addr)
    store.set(f"gloo_address/{rank}", mine or "-")
    keys = [f"gloo_address/{k}" for k in range(world_size)]
    target = master_addr
    if mine is not None and _is_loopback(mine):
        try:
            store.wait(keys, datetime.timedelta(seconds=timeout))
            seen = [store.get(key).decode() for key in keys]
        except Exception:  # noqa: BLE001 - a rank gone: the group's own checks will name it
            seen = []
        target = next((a for a in seen if a != "-" and not _is_loopback(a)), master_addr)
    name = interface_towards(target)
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = _chosen = name
    return name


__all__ = ["bind_gloo_to_route", "interface_towards", "source_address"]
