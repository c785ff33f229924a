"""Hosts made of network namespaces, for the cross-host liveness tests (a minimal fixture of their own).

    PREFIX-sw          a namespace holding the bridge br0 (the switch)
    PREFIX-h0 ...      the hosts: lo and eth0 up, eth0 = 10.213.77.(K+1)/24, hostname PREFIXhK in a
                       UTS namespace of each command's own, /etc/netns/PREFIX-hK/hosts naming them all

Each veth pair is created with both ends already in their namespaces, so nothing is ever made in
the machine's own namespace, and `down` (deleting the namespaces and the /etc/netns folders) leaves
nothing behind, also after a crash. Commands enter a host with `command(k, argv)`; Hydra reaches a
host through `ssh_stand_in()` (`mpiexec -launcher ssh -launcher-exec THAT`).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

SUBNET = "10.213.77"
NETNS_ETC = Path("/etc/netns")

#: The ssh that Hydra runs: `[options] HOST COMMAND...` -> the command in that host's shell.
_SSH = """#!{python} -I
import os, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args = args[1:]
host, words = args[0], " ".join(args[1:])
os.execvp("ip", ["ip", "netns", "exec", "{prefix}-" + host.rsplit("{prefix}", 1)[1],
                 "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec sh -c "$1"', host, words])
"""


def usable() -> str:
    """'' when hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install iproute2 util-linux)"
    return ""


class Hosts:
    """`n` hosts named PREFIXh0... (see the module docstring); a context manager that always
    tears them down."""

    def __init__(self, n: int, prefix: str, workdir: Path):
        self.n, self.prefix, self.workdir = n, prefix, Path(workdir)
        self.switch = f"{prefix}-sw"

    # ---- names ---------------------------------------------------------------------------------
    def name(self, k: int) -> str:
        """Host k's host name (and what the hostfile and the messages call it)."""
        return f"{self.prefix}h{k}"

    def namespace(self, k: int) -> str:
        return f"{self.prefix}-h{k}"

    def address(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    # ---- up and down ---------------------------------------------------------------------------
    def __enter__(self) -> "Hosts":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        self.down()
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        hosts = "".join(f"{self.address(k)} {self.name(k)}\n" for k in range(self.n))
        for k in range(self.n):
            ns = self.namespace(k)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{k}")
            _ip("-n", ns, "link", "set", f"p{k}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"p{k}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{hosts}")

    def down(self) -> None:
        """Kill what runs in the hosts, remove every namespace and /etc/netns folder made."""
        for k in range(self.n):
            for pid in self.pids(k):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for ns in [self.namespace(k) for k in range(self.n)] + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)

    def leftovers(self) -> List[str]:
        """The namespaces of this fixture that still exist."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in listed.splitlines() if line.startswith(self.prefix)]

    # ---- using them ------------------------------------------------------------------------------
    def command(self, k: int, argv: Sequence[str]) -> List[str]:
        """`argv` run on host k: its network, its /etc/hosts, its host name."""
        return [
            "ip",
            "netns",
            "exec",
            self.namespace(k),
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            self.name(k),
            *argv,
        ]

    def ssh_stand_in(self) -> Path:
        """A program Hydra runs in place of ssh (`-launcher ssh -launcher-exec PATH`)."""
        path = self.workdir / f"{self.prefix}-ssh"
        path.write_text(_SSH.format(python=sys.executable, prefix=self.prefix))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return path

    def hostfile(self) -> Path:
        path = self.workdir / f"{self.prefix}-hosts"
        path.write_text("".join(f"{self.name(k)}\n" for k in range(self.n)))
        return path

    def pids(self, k: int) -> List[int]:
        listed = subprocess.run(
            ["ip", "netns", "pids", self.namespace(k)], capture_output=True, text=True
        ).stdout
        return [int(p) for p in listed.split()]

    def cut(self, k: int) -> None:
        _ip("-n", self.namespace(k), "link", "set", "eth0", "down")

    def signal_all(self, k: int, signum: int) -> Dict[int, bool]:
        """Send `signum` to every process of host k; {pid: delivered}."""
        sent = {}
        for pid in self.pids(k):
            try:
                os.kill(pid, signum)
                sent[pid] = True
            except OSError:
                sent[pid] = False
        return sent


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
