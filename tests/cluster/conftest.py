"""What the cluster tests share: the mark that skips without the privileges network namespaces
need, a `prefix` fixture whose cluster is checked to leave nothing behind, and running code on a
host (tests/cluster/test_network.py, tests/cluster/test_main.py)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest

from gossip_powersgd.cluster import network
from gossip_powersgd.cluster.enter import enter_command

needs_namespaces = pytest.mark.skipif(
    bool(network.missing_privileges()),
    reason="making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)",
)
_names = itertools.count()


def root_links() -> set:
    shown = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in shown.splitlines()}


def left_of(prefix: str) -> list:
    return network.owned(prefix) + [n for n in network.namespaces() if n.startswith(f"{prefix}-")]


@pytest.fixture
def prefix():
    """A prefix no other cluster uses; afterwards, nothing of it may be left (other sessions'
    clusters may come and go meanwhile: they carry their own prefixes), and the machine's own
    namespace has the links it had."""
    name = f"gt{os.getpid() % 10**6}{next(_names)}"
    links = root_links()
    assert not left_of(name)
    try:
        yield name
    finally:
        network.down(name)
        assert left_of(name) == []
        assert root_links() == links


def wait_for(condition, seconds=60):
    """Wait until `condition()` holds (a signal delivered, an exec done); fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still not so after {seconds} s"
        time.sleep(0.02)


def in_host(prefix, host, code, *args, timeout=60):
    """Run python `code` on `host` (the standard library only: no torch to load)."""
    command = enter_command(prefix, host, [sys.executable, "-I", "-S", "-c", code, *args])
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
