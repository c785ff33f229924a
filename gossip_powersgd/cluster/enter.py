"""Entering a host: `exec`, the ssh stand-in that Hydra's `-launcher-exec` runs, and which cluster
the calling process is in.

A command enters host K through `ip netns exec P-hostK` (the host's network, its /etc/hosts) and a
UTS namespace of its own whose hostname is hostK, as on a machine of that name: Hydra tells its
proxies to call back to `hostname`:port, torchrun's c10d rendezvous publishes rank 0's fully
qualified name, and gloo binds where the hostname resolves.
"""

from __future__ import annotations

import os
import re
import sys
from typing import List, Optional, Sequence, Tuple

from ..utils import write_stderr_line
from .network import (
    DEFAULT_PREFIX,
    NETNS_RUN,
    PREFIX_ENV,
    ClusterError,
    check_prefix,
    host_ns,
    namespaces,
    require_host,
    require_privileges,
)

#: Run by the host's python (isolated: -I -S, nothing imported but the standard library) inside the
#: namespace: a UTS namespace with the host's name, then the command in place of this process.
_SET_HOSTNAME_AND_EXEC = """
import ctypes, os, socket, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x04000000) != 0:  # CLONE_NEWUTS
    sys.exit("cannot give the host its own hostname: " + os.strerror(ctypes.get_errno()))
socket.sethostname(sys.argv[1])
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"{sys.argv[2]}: {exc.strerror}\\n")
    sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)
"""

#: ssh's options that take a value (ssh(1)); the rest are flags. Hydra gives `-x HOST COMMAND`.
_SSH_VALUE_OPTIONS = set("BbcDEeFIiJLlmOoPpQRSWw")


def current_prefix() -> Optional[str]:
    """The prefix of the cluster whose host this process runs in (its network namespace is one of
    /run/netns/P-hostK), or None."""
    try:
        mine = os.stat("/proc/self/ns/net")
    except OSError:
        return None
    for name in namespaces():
        match = re.fullmatch(r"([a-z][a-z0-9]*)-host\d+", name)
        if not match:
            continue
        try:
            entry = os.stat(NETNS_RUN / name)
        except OSError:
            continue
        if (entry.st_dev, entry.st_ino) == (mine.st_dev, mine.st_ino):
            return match.group(1)
    return None


def resolve_prefix(explicit: Optional[str] = None) -> str:
    """--prefix, else the cluster this process is in, else $GOSSIP_CLUSTER_PREFIX, else "gp"."""
    prefix = explicit or current_prefix() or os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX
    return check_prefix(prefix)


def enter_command(prefix: str, host: str, command: Sequence[str]) -> List[str]:
    """The argv that runs `command` on `host` of cluster `prefix` (checked to exist)."""
    if not command:
        raise ClusterError("no command given: exec HOST -- COMMAND [ARGS...]")
    host = require_host(prefix, host)
    return [
        "ip",
        "netns",
        "exec",
        host_ns(prefix, host),
        sys.executable,
        "-I",
        "-S",
        "-c",
        _SET_HOSTNAME_AND_EXEC,
        host,
        *command,
    ]


def exec_on(prefix: str, host: str, command: Sequence[str]) -> None:
    """Replace this process by `command` running on `host` (its exit status is the command's)."""
    require_privileges()
    argv = enter_command(prefix, host, command)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)


def split_ssh_arguments(args: Sequence[str]) -> Tuple[str, List[str]]:
    """(host, command words) from an ssh command line: `[options] [user@]host command...`."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        word, i = args[i], i + 1
        if word == "--":
            break
        for at, letter in enumerate(word[1:], start=1):
            if letter in _SSH_VALUE_OPTIONS:
                if at == len(word) - 1:
                    i += 1  # the value is the next word
                break
    if i >= len(args):
        raise ClusterError("no host given: [ssh options] HOST COMMAND")
    host, command = args[i].rpartition("@")[2], list(args[i + 1 :])
    if not command:
        raise ClusterError(
            f"no command for {host} (for a shell there: python -m gossip_powersgd.cluster exec "
            f"{host} -- bash)"
        )
    return host, command


def ssh_main(argv: Optional[List[str]] = None) -> None:
    """`gossip-cluster-ssh [ssh options] HOST COMMAND...`: ssh's stand-in on an emulated cluster
    (Hydra: `mpiexec -launcher ssh -launcher-exec gossip-cluster-ssh`). As ssh does, the command's
    words are joined by spaces and run by the host's shell; the cluster is the one the caller runs
    in (else $GOSSIP_CLUSTER_PREFIX, else gp). An error is one line and exit status 255, ssh's."""
    args = sys.argv[1:] if argv is None else argv
    try:
        host, words = split_ssh_arguments(args)
        exec_on(resolve_prefix(), host, ["sh", "-c", " ".join(words)])
    except (ClusterError, OSError) as exc:
        write_stderr_line(f"gossip-cluster-ssh: {exc}")
        sys.exit(255)
