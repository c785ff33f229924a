"""cluster/__main__.py, `python -m gossip_powersgd.cluster`: one line naming what is missing (iproute2,
privileges), and cut, heal, pids, kill, status and down on a cluster of three hosts (up, the hosts'
names and addresses, rates and launches across them: tests/cluster/test_network.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gossip_powersgd.cluster import __main__ as cli
from gossip_powersgd.cluster import network
from gossip_powersgd.cluster.enter import enter_command
from tests.cluster.conftest import in_host, needs_namespaces, wait_for


def test_without_iproute2_on_path_one_line_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as exit:
        cli.main(["up", "--hosts", "2"])
    assert exit.value.code != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "ip and tc not found on PATH" in lines[0], lines


@needs_namespaces
def test_without_privileges_one_line_names_them(tmp_path):
    if subprocess.run(["which", "setpriv"], capture_output=True).returncode != 0:
        pytest.skip("setpriv (util-linux) is not installed: no way to drop capabilities here")
    result = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
        + [sys.executable, "-m", "gossip_powersgd.cluster", "up", "--hosts", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CAP_NET_ADMIN and CAP_SYS_ADMIN" in lines[0], result.stderr


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=float(sys.argv[2]))
except ConnectionRefusedError:
    print("reached")  # the host answered: nothing listens on port 9
except OSError as exc:
    print("unreachable", type(exc).__name__)
"""


@needs_namespaces
def test_cut_heal_pids_kill_and_down_end_the_processes(prefix, capsys):
    network.up(prefix, 3, None, {})

    def connect(source, dest, seconds):
        return in_host(prefix, source, CONNECT, dest, str(seconds)).stdout.split()

    assert connect("host0", "host2", 30) == ["reached"]
    cli.run(["cut", "--prefix", prefix, "host2"])  # its cable, at the switch
    assert capsys.readouterr().out == "host2: link cut\n"
    # no answer either way, however long one waits (here: 2 s, then give up), and no error
    assert connect("host0", "host2", 2)[0] == "unreachable"
    assert connect("host2", "host0", 2)[0] == "unreachable"
    cli.run(["heal", "--prefix", prefix, "host2"])
    assert connect("host0", "host2", 30) == connect("host2", "host0", 30) == ["reached"]
    cli.run(["cut", "--prefix", prefix, "host2", "--at", "host"])  # its eth0 down: no route
    assert capsys.readouterr().out.endswith("host2: link down\n")
    assert connect("host2", "host0", 30) == ["unreachable", "OSError"]  # at once: no route
    cli.run(["heal", "--prefix", prefix, "host2"])
    assert connect("host2", "host0", 30) == ["reached"]

    sleeper = subprocess.Popen(enter_command(prefix, "host1", ["sleep", "600"]))
    try:
        comm = Path(f"/proc/{sleeper.pid}/comm")
        wait_for(lambda: comm.read_text() == "sleep\n")  # the exec chain ends in sleep, same pid
        capsys.readouterr()
        cli.run(["pids", "--prefix", prefix, "host1"])
        assert capsys.readouterr().out == f"{sleeper.pid}\n"
        cli.run(["kill", "--prefix", prefix, "host1", "--signal", "STOP"])
        wait_for(lambda: Path(f"/proc/{sleeper.pid}/stat").read_text().split()[2] == "T")
        cli.run(["status", "--prefix", prefix])
        assert re.search(rf"^host1 .* {sleeper.pid} sleep$", capsys.readouterr().out, re.M)
        cli.run(["down", "--prefix", prefix])  # a stopped process, too, is ended
        assert sleeper.wait(timeout=60) == -signal.SIGKILL
        assert capsys.readouterr().out.endswith("removed 7 entries\n")  # 4 namespaces, 3 files
    finally:
        sleeper.kill()
