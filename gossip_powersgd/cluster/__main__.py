"""The command line of the emulated cluster: `python -m gossip_powersgd.cluster COMMAND`.

    up --hosts N [--rate R] [--rate-of HOST=R ...]   make host0 ... host{N-1}
    down                                             remove the cluster (ends its processes)
    status                                           hosts, addresses, rates, links, processes
    exec HOST -- COMMAND [ARGS...]                   run a command on a host
    rate HOST|all R                                  change a host's link rate (10mbit, unlimited)
    cut HOST [--at host] / heal HOST                 pull / plug back a host's cable
    pids HOST                                        the processes on a host, one pid a line
    kill HOST [--signal KILL]                        signal every process on a host (STOP, CONT ...)
    throughput SRC DST [--megabytes M]               one TCP stream's payload rate from SRC to DST

Every command takes --prefix P (default: the cluster this process runs in, else
$GOSSIP_CLUSTER_PREFIX, else gp). An error is one line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ..launch import main_guard
from . import network
from .enter import exec_on, resolve_prefix
from .network import ClusterError, parse_rate, require_host

PROGRAM = "python -m gossip_powersgd.cluster"


def _rate_of(text: str):
    host, sep, rate = text.partition("=")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"{text!r}: give HOST=RATE, e.g. host3=10mbit")
    return host, rate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Hosts on this machine (network namespaces on one switch, rate-limited links).",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix", help="the cluster's name prefix (default gp)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    up = commands.add_parser("up", parents=[common], help="make host0 ... host{N-1}")
    up.add_argument("--hosts", type=int, required=True, metavar="N")
    up.add_argument("--rate", default="unlimited", help="every host's link rate (e.g. 100mbit)")
    up.add_argument(
        "--rate-of",
        type=_rate_of,
        action="append",
        default=[],
        metavar="HOST=RATE",
        help="one host's rate instead (repeatable)",
    )
    commands.add_parser("down", parents=[common], help="remove the cluster")
    commands.add_parser("status", parents=[common], help="hosts, addresses, rates, processes")
    run = commands.add_parser("exec", parents=[common], help="run a command on a host")
    run.add_argument("host")
    run.add_argument("words", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    rate = commands.add_parser("rate", parents=[common], help="change a host's link rate")
    rate.add_argument("host", help="hostK, or all")
    rate.add_argument("rate", help="e.g. 10mbit, or unlimited")
    for name, text in (("cut", "pull a host's cable"), ("heal", "plug it back"), ("pids", "")):
        sub = commands.add_parser(name, parents=[common], help=text or "a host's processes")
        sub.add_argument("host")
        if name == "cut":
            sub.add_argument(
                "--at",
                choices=("switch", "host"),
                default="switch",
                help="switch: its port (a pulled cable, default); host: its eth0 down",
            )
    kill = commands.add_parser("kill", parents=[common], help="signal every process on a host")
    kill.add_argument("host")
    kill.add_argument("--signal", default="KILL", help="KILL (default), TERM, STOP, CONT ...")
    measure = commands.add_parser("throughput", parents=[common], help="measure a link")
    measure.add_argument("source")
    measure.add_argument("dest")
    measure.add_argument("--megabytes", type=float, default=4.0, help="how much to send (4)")
    return parser


def _signal(name: str) -> signal.Signals:
    spelled = name.upper()
    try:
        return signal.Signals[spelled if spelled.startswith("SIG") else f"SIG{spelled}"]
    except KeyError:
        raise ClusterError(f"unknown signal {name!r}: give KILL, TERM, STOP, CONT, INT ...")


def command_up(prefix: str, args) -> None:
    rate = parse_rate(args.rate)
    rates: Dict[str, Optional[int]] = {host: parse_rate(r) for host, r in args.rate_of}
    network.up(prefix, args.hosts, rate, rates)
    print(f"cluster {prefix}: {args.hosts} hosts up")
    print_status(prefix)


def print_status(prefix: str) -> None:
    """The table of `status`: one line per host."""
    hosts = network.cluster_hosts(prefix)
    if not hosts:
        leftovers = network.owned(prefix)
        if leftovers:
            raise ClusterError(
                f"cluster {prefix!r} is incomplete ({', '.join(leftovers)}): remove it with "
                f"{PROGRAM} down --prefix {prefix}"
            )
        require_host(prefix, "host0")  # the one line: no cluster is up
    print(f"{'host':8}{'address':16}{'rate (each way)':17}{'link':6}processes")
    for host in hosts:
        k = network.host_index(host)
        try:
            rate, link = network.rate_of(prefix, host), network.link_state(prefix, host)
        except ClusterError:
            rate, link = "?", "broken (run down, then up)"
        found = network.pids(network.host_ns(prefix, host))
        shown = ", ".join(f"{pid} {_name(pid)}" for pid in found) or "-"
        print(f"{host:8}{network.address(k):16}{rate:17}{link:6}{shown}")


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def command_rate(prefix: str, args) -> None:
    bits = parse_rate(args.rate)
    hosts = network.cluster_hosts(prefix) if args.host == "all" else []
    for host in hosts or [require_host(prefix, args.host)]:
        network.set_rate(prefix, host, bits)
        print(f"{host}: {network.rate_of(prefix, host)}")


def command_kill(prefix: str, args) -> None:
    host = require_host(prefix, args.host)
    sig = _signal(args.signal)
    found = network.signal_host(prefix, host, sig)
    listed = f": {' '.join(map(str, found))}" if found else ""
    print(f"{host}: {sig.name} sent to {len(found)} process(es){listed}")


def command_throughput(prefix: str, args) -> None:
    from .measure import PAYLOAD_SHARE, throughput

    if not 0 < args.megabytes <= 10_000:
        raise ClusterError(f"--megabytes {args.megabytes:g}: give more than 0, at most 10000")
    bits = throughput(prefix, args.source, args.dest, int(args.megabytes * 1e6))
    links = ", ".join(
        f"{host} {network.rate_of(prefix, require_host(prefix, host))}"
        for host in (args.source, args.dest)
    )
    print(
        f"{args.source} -> {args.dest}: {bits / 1e6:.3f} Mbit/s of TCP payload (links: {links}; "
        f"a tbf rate lets at most {PAYLOAD_SHARE:.1%} of it through as TCP payload)"
    )


def run(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    prefix = resolve_prefix(args.prefix)
    if args.command == "exec":
        words = args.words[1:] if args.words[:1] == ["--"] else args.words
        exec_on(prefix, args.host, words)  # does not return
    network.require_privileges()
    if args.command == "up":
        command_up(prefix, args)
    elif args.command == "down":
        removed = network.down(prefix)
        done = f"removed {len(removed)} entries" if removed else "nothing to remove"
        print(f"cluster {prefix}: {done}")
    elif args.command == "status":
        print_status(prefix)
    elif args.command == "rate":
        command_rate(prefix, args)
    elif args.command in ("cut", "heal"):
        host = require_host(prefix, args.host)
        network.set_link(prefix, host, args.command == "heal", getattr(args, "at", "switch"))
        print(f"{host}: link {network.link_state(prefix, host)}")
    elif args.command == "pids":
        for pid in network.pids(network.host_ns(prefix, require_host(prefix, args.host))):
            print(pid)
    elif args.command == "kill":
        command_kill(prefix, args)
    elif args.command == "throughput":
        command_throughput(prefix, args)
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    main_guard(run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
