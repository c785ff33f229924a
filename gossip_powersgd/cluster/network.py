"""The emulated network: namespaces, veth cables, one bridge, tbf rate limits (iproute2's ip, tc).

One cluster with prefix P is, all of it made by `up` and removed by `down`:

    P-switch            a network namespace holding the bridge br0 (the switch)
    P-host0 ... P-hostK network namespaces, the hosts: lo up, eth0 = 192.168.77.(K+1)/24
    a veth pair per host: eth0 in the host, port hostK on br0 in the switch
    /etc/netns/P-hostK/hosts  name resolution inside each host (host0 ... resolve there);
                        `ip netns exec` bind-mounts it over /etc/hosts

Nothing is made in the machine's own namespace: each veth pair is created with its two ends
already inside their namespaces, so deleting the namespaces removes every link, and a `down` after
a crash anywhere in `up` finds everything by the prefix (the kernel and /etc/netns are the only
record; there is no state file to go stale).

A host's rate limits its link in both directions, like a NIC's speed: a tbf on eth0 inside the host
(what it sends) and one on its switch port (what it receives). tbf's burst is 1 ms at the rate but
at least 4 KiB (below, MTU-sized packets would not pass; at 1 Gbit/s a 4 KiB burst held a TCP
stream to 790 Mbit/s here, 1 ms let it carry 918-955), its queue 100 ms at the rate but at least
64 KiB (at 1 Mbit/s, 100 ms is 8 packets: two streams into one host then lost a sixth of the rate
to drops; 64 KiB carried them at the full rate). tbf counts each packet's Ethernet frame, so a TCP
stream's payload gets at most 1448/1514 = 95.6 % of the rate.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from ..utils import atomic_write

#: The prefix of a cluster's names when neither --prefix nor GOSSIP_CLUSTER_PREFIX gives one.
DEFAULT_PREFIX = "gp"
PREFIX_ENV = "GOSSIP_CLUSTER_PREFIX"
#: Host K's address is SUBNET.(K+1); one /24, so at most MAX_HOSTS hosts. Above 127.0.0.1 in the
#: order gloo compares addresses by to pick which side of a pair connects: a rank bound to loopback
#: by mistake fails here, as on a 192.168/16 network, instead of being reached by luck (10/8).
SUBNET = "192.168.77"
MAX_HOSTS = 250
#: Each host's one interface, and the switch's bridge (both inside the cluster's namespaces).
INTERFACE = "eth0"
BRIDGE = "br0"
NETNS_RUN = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")
#: tbf: the burst is BURST_SECONDS at the rate (at least MIN_BURST bytes), the queue QUEUE_SECONDS
#: at the rate (at least MIN_QUEUE bytes).
BURST_SECONDS = 0.001
MIN_BURST = 4096
QUEUE_SECONDS = 0.1
MIN_QUEUE = 65536
#: How long `down` gives a host's processes to end after SIGTERM before SIGKILL.
TERM_GRACE = 3.0

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


class ClusterError(ValueError):
    """A refused request or a failed iproute2 command: one line, naming the fix."""


# ---- names --------------------------------------------------------------------------------------
def check_prefix(prefix: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", prefix or ""):
        raise ClusterError(
            f"prefix {prefix!r} is not usable: give 1-12 lower-case letters or digits, starting "
            "with a letter (every name the cluster makes starts with PREFIX-)"
        )
    return prefix


def switch_ns(prefix: str) -> str:
    return f"{prefix}-switch"


def host_ns(prefix: str, host: str) -> str:
    return f"{prefix}-{host}"


def address(index: int) -> str:
    return f"{SUBNET}.{index + 1}"


def host_index(host: str) -> Optional[int]:
    """K for "hostK" or for host K's address, else None."""
    match = re.fullmatch(r"host(0|[1-9][0-9]*)", host) or re.fullmatch(
        re.escape(SUBNET) + r"\.([1-9][0-9]*)", host
    )
    if match is None:
        return None
    return int(match.group(1)) - (0 if host.startswith("host") else 1)


def namespaces() -> List[str]:
    """The names of the machine's named network namespaces (the entries of /run/netns)."""
    try:
        return sorted(p.name for p in NETNS_RUN.iterdir())
    except FileNotFoundError:
        return []


def cluster_hosts(prefix: str) -> List[str]:
    """The hosts of cluster `prefix` (host0, host1, ...), in order."""
    found = [
        m.group(1) for m in (re.fullmatch(rf"{prefix}-(host\d+)", n) for n in namespaces()) if m
    ]
    return sorted(found, key=lambda h: int(h[4:]))


def require_host(prefix: str, host: str) -> str:
    """`host` as hostK when cluster `prefix` has it, else a one-line ClusterError."""
    index = host_index(host)
    hosts = cluster_hosts(prefix)
    if index is not None and f"host{index}" in hosts:
        return f"host{index}"
    if not hosts:
        raise ClusterError(
            f"no cluster {prefix!r} is up: start one with python -m gossip_powersgd.cluster up "
            f"--hosts N{'' if prefix == DEFAULT_PREFIX else f' --prefix {prefix}'}"
        )
    raise ClusterError(
        f"cluster {prefix!r} has no host {host!r}: its hosts are host0 ... host{len(hosts) - 1}"
    )


# ---- requirements and commands ------------------------------------------------------------------
def missing_tools() -> List[str]:
    """iproute2's programs that are not on PATH."""
    return [tool for tool in ("ip", "tc") if shutil.which(tool) is None]


def missing_privileges() -> List[str]:
    """The capabilities this process lacks to make network namespaces and mount their files."""
    caps = _effective_capabilities()
    return [
        name
        for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
        if caps is not None and not caps >> bit & 1
    ]


def missing_requirements() -> Optional[str]:
    """One line naming what this machine lacks to run the cluster (iproute2's ip and tc on PATH,
    CAP_NET_ADMIN and CAP_SYS_ADMIN: root), or None."""
    problems = []
    tools, lacking = missing_tools(), missing_privileges()
    if tools:
        problems.append(
            f"{' and '.join(tools)} not found on PATH (install iproute2: apt-get install "
            "iproute2, which make install does as root)"
        )
    if lacking:
        problems.append(
            f"no {' and '.join(lacking)} (uid {os.geteuid()}): network namespaces need root "
            "(run it with sudo; in a container, grant both capabilities)"
        )
    return "; ".join(problems) or None


def _effective_capabilities() -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return None if os.geteuid() == 0 else 0


def require_privileges() -> None:
    problem = missing_requirements()
    if problem:
        raise ClusterError(f"the cluster tool cannot run here: {problem}")


def run(*command: str, check: bool = True) -> str:
    """Run an iproute2 command; its stdout, or (when `check`) a ClusterError with its own line."""
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip() or "no message").splitlines()[0]
        raise ClusterError(f"{' '.join(command)} failed: {said}")
    return result.stdout


# ---- rates --------------------------------------------------------------------------------------
def parse_rate(text: str) -> Optional[int]:
    """Bits per second of a rate spelled as tc does ("100mbit", "1gbit", "500kbit"); None for
    "unlimited". Bytes per second ("mbps", tc's spelling of megabytes) are refused: too easy to
    mistake for megabits."""
    spelled = str(text).strip().lower()
    if spelled in ("unlimited", "none"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?bit)", spelled)
    if match is None:
        hint = " (tc reads bps as bytes per second)" if spelled.endswith("bps") else ""
        raise ClusterError(
            f"rate {text!r} is not a rate: give bits per second as tc spells them, e.g. 1gbit, "
            f"100mbit, 500kbit, or unlimited{hint}"
        )
    bits = float(match.group(1)) * _UNITS[match.group(2)]
    if bits < 8 * MIN_BURST / 10:  # a burst of more than 10 s of traffic: not a rate limit
        raise ClusterError(f"rate {text!r} is below the smallest tbf rate here: give >= 4kbit")
    return int(bits)


def format_rate(bits: Optional[int]) -> str:
    if bits is None:
        return "unlimited"
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits >= _UNITS[unit] and bits % _UNITS[unit] == 0:
            return f"{bits // _UNITS[unit]}{unit}"
    return f"{bits}bit"


def tbf_arguments(bits: int) -> List[str]:
    burst = max(MIN_BURST, int(bits / 8 * BURST_SECONDS))
    limit = max(MIN_QUEUE, int(bits / 8 * QUEUE_SECONDS))
    return ["tbf", "rate", f"{bits}bit", "burst", str(burst), "limit", str(limit)]


def _shape(namespace: str, device: str, bits: Optional[int]) -> None:
    if bits is None:
        shown = run("tc", "-n", namespace, "qdisc", "show", "dev", device, "root")
        if " tbf " in f" {shown}":
            run("tc", "-n", namespace, "qdisc", "del", "dev", device, "root")
        return
    run("tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", *tbf_arguments(bits))


def set_rate(prefix: str, host: str, bits: Optional[int]) -> None:
    """Limit `host`'s link to `bits` per second both ways (None: no limit); takes effect at once
    for traffic already flowing."""
    _shape(host_ns(prefix, host), INTERFACE, bits)
    _shape(switch_ns(prefix), host, bits)


def rate_of(prefix: str, host: str) -> str:
    """The rate the kernel applies to `host`'s egress, as tc prints it ("100Mbit"), or unlimited."""
    shown = run("tc", "-n", host_ns(prefix, host), "qdisc", "show", "dev", INTERFACE, "root")
    match = re.search(r"\btbf\b.*?\brate (\S+)", shown)
    return match.group(1) if match else "unlimited"


# ---- up and down --------------------------------------------------------------------------------
def hosts_file(count: int) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address(k)}\thost{k}" for k in range(count)]
    return "\n".join(lines) + "\n"


def up(prefix: str, count: int, rate: Optional[int], rates: Dict[str, Optional[int]]) -> None:
    """Make cluster `prefix` of `count` hosts, host K's rate `rates.get(hostK, rate)`. A failure,
    Ctrl-C, SIGTERM or SIGHUP removes what was made; a SIGKILLed `up` leaves what `down`
    removes."""
    check_prefix(prefix)
    if not 1 <= count <= MAX_HOSTS:
        raise ClusterError(f"--hosts {count}: give 1 to {MAX_HOSTS} hosts (one /24 subnet)")
    unknown = sorted(set(rates) - {f"host{k}" for k in range(count)}, key=str)
    if unknown:
        raise ClusterError(
            f"--rate-of names {', '.join(unknown)}, not a host of a {count}-host cluster "
            f"(host0 ... host{count - 1})"
        )
    require_privileges()
    leftovers = owned(prefix)
    if leftovers:
        raise ClusterError(
            f"cluster {prefix!r} exists already ({len(leftovers)} entries: {leftovers[0]} ...): "
            f"remove it with python -m gossip_powersgd.cluster down"
            f"{'' if prefix == DEFAULT_PREFIX else f' --prefix {prefix}'}, or use another --prefix"
        )
    with exits_on_termination():
        try:
            _make_switch(prefix)
            for k in range(count):
                _make_host(prefix, k, count, rates.get(f"host{k}", rate))
        except BaseException:
            down(prefix)
            raise


#: The signals a user or a supervisor ends a process with, besides Ctrl-C's SIGINT.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def exits_on_termination() -> Iterator[None]:
    """Within it, SIGTERM or SIGHUP raises SystemExit(128 + signal) (what the default action's
    status reads as), so that cleanup code (finally, except BaseException) runs as on Ctrl-C;
    further ones are ignored while it does. Only the main thread receives signals: elsewhere it
    does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in TERMINATING}

    def terminate(signum, _frame):
        for sig in TERMINATING:
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for sig in TERMINATING:
        signal.signal(sig, terminate)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _make_switch(prefix: str) -> None:
    switch = switch_ns(prefix)
    run("ip", "netns", "add", switch)
    run("ip", "-n", switch, "link", "set", "lo", "up")
    run("ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge")
    run("ip", "-n", switch, "link", "set", BRIDGE, "up")


def _make_host(prefix: str, k: int, count: int, bits: Optional[int]) -> None:
    host, switch = f"host{k}", switch_ns(prefix)
    namespace = host_ns(prefix, host)
    run("ip", "netns", "add", namespace)
    atomic_write(NETNS_ETC / namespace / "hosts", hosts_file(count))
    run("ip", "-n", namespace, "link", "set", "lo", "up")
    # both ends are born inside their namespaces: nothing ever sits in the machine's own
    run(
        "ip",
        "link",
        "add",
        INTERFACE,
        "netns",
        namespace,
        "type",
        "veth",
        "peer",
        "name",
        host,
        "netns",
        switch,
    )
    run("ip", "-n", switch, "link", "set", host, "master", BRIDGE, "up")
    run("ip", "-n", namespace, "addr", "add", f"{address(k)}/24", "dev", INTERFACE)
    run("ip", "-n", namespace, "link", "set", INTERFACE, "up")
    if bits is not None:
        set_rate(prefix, host, bits)


def owned(prefix: str) -> List[str]:
    """Everything of cluster `prefix` on this machine: its namespaces and /etc/netns entries."""
    pattern = re.compile(rf"{re.escape(prefix)}-(switch|host\d+)")
    found = [n for n in namespaces() if pattern.fullmatch(n)]
    if NETNS_ETC.is_dir():
        found += [
            str(NETNS_ETC / p.name)
            for p in sorted(NETNS_ETC.iterdir())
            if pattern.fullmatch(p.name)
        ]
    return found


def down(prefix: str) -> List[str]:
    """Remove cluster `prefix`: end the processes in its hosts (SIGTERM, SIGKILL after
    TERM_GRACE s), delete its namespaces (their links go with them) and /etc/netns entries.
    Returns what was removed; nothing to remove is no error."""
    check_prefix(prefix)
    require_privileges()
    removed = owned(prefix)
    hosts = [n for n in removed if not n.startswith("/") and n != switch_ns(prefix)]
    end_processes(hosts)
    for name in removed:
        if name.startswith("/"):
            shutil.rmtree(name, ignore_errors=True)
        else:
            run("ip", "netns", "delete", name, check=False)
            if (NETNS_RUN / name).exists():  # an `ip netns add` killed before its mount
                (NETNS_RUN / name).unlink()
    left = owned(prefix)
    if left:
        raise ClusterError(f"could not remove {', '.join(left)}: remove it by hand (ip netns del)")
    return removed


def pids(namespace: str) -> List[int]:
    """The processes living in network namespace `namespace` (`ip netns pids`)."""
    out = run("ip", "netns", "pids", namespace, check=False)
    return sorted(int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid())


def end_processes(namespaces_: List[str]) -> None:
    """SIGTERM every process in `namespaces_`, SIGKILL (and SIGCONT) those left after
    TERM_GRACE s: a stopped one cannot act on SIGTERM."""
    _signal_all(namespaces_, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE
    while time.monotonic() < deadline and any(pids(n) for n in namespaces_):
        time.sleep(0.05)
    _signal_all(namespaces_, signal.SIGKILL)


def _signal_all(namespaces_: List[str], sig: int) -> List[int]:
    sent = []
    for namespace in namespaces_:
        for pid in pids(namespace):
            try:
                os.kill(pid, sig)
                sent.append(pid)
            except ProcessLookupError:
                pass
    return sent


def signal_host(prefix: str, host: str, sig: int) -> List[int]:
    """Send `sig` to every process on `host`; the pids it reached."""
    return _signal_all([host_ns(prefix, host)], sig)


def set_link(prefix: str, host: str, up: bool, at: str = "switch") -> None:
    """Cut `host`'s cable (`up` False) or plug it back. At the switch (its port down), as a pulled
    cable: the host's eth0 loses its carrier but keeps its address and route, and traffic both
    ways vanishes without an error on either side. At the host (`at` "host": its eth0 down, as
    `ip link set eth0 down` there): its route goes, so its own sends fail at once (no route),
    while the others hear nothing. Plugging back brings both ends up; the route comes back."""
    ends = [(switch_ns(prefix), host), (host_ns(prefix, host), INTERFACE)]
    if not up:
        ends = ends[:1] if at == "switch" else ends[1:]
    for namespace, device in ends:
        run("ip", "-n", namespace, "link", "set", device, "up" if up else "down")


def link_state(prefix: str, host: str) -> str:
    """ "up", "cut" (no carrier: its switch port is down) or "down" (its eth0 is down)."""
    shown = run("ip", "-n", host_ns(prefix, host), "-o", "link", "show", INTERFACE)
    flags = re.search(r"<([^>]*)>", shown)
    flags = flags.group(1).split(",") if flags else []
    return "down" if "UP" not in flags else "up" if "LOWER_UP" in flags else "cut"
