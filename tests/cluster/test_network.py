"""cluster/network.py: the emulated cluster's hosts, their names, addresses and rate-limited links,
and launches across them (the command line's own subcommands: tests/cluster/test_main.py).

The hosts are network namespaces: the tests that make them need root (CAP_NET_ADMIN and
CAP_SYS_ADMIN) and skip without it. Every cluster a test makes carries a prefix of its own, and
its teardown checks that nothing of it is left: no namespace, no /etc/netns entry, no link in the
machine's own namespace.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import in_host, left_of, needs_namespaces
from tests.conftest import ROOT, run_bounded
from gossip_powersgd.cluster import __main__ as cli
from gossip_powersgd.cluster import network
from gossip_powersgd.cluster.enter import enter_command
from gossip_powersgd.cluster.measure import PAYLOAD_SHARE, throughput

BIN = Path(sys.executable).parent
INTERFACES = ROOT / "gossip_powersgd" / "comm" / "interfaces.py"


# ---- without namespaces --------------------------------------------------------------------------
def test_rates_are_bits_per_second_as_tc_spells_them():
    assert network.parse_rate("100mbit") == 10**8
    assert network.parse_rate("1.5Gbit") == 15 * 10**8
    assert network.parse_rate("unlimited") is None
    assert network.format_rate(10**7) == "10mbit"
    with pytest.raises(network.ClusterError, match="bytes per second"):
        network.parse_rate("100mbps")
    with pytest.raises(network.ClusterError, match="is not a rate"):
        network.parse_rate("fast")


def test_tbf_burst_is_a_millisecond_at_the_rate_and_at_least_4_kib():
    def burst(bits):
        arguments = network.tbf_arguments(bits)
        return int(arguments[arguments.index("burst") + 1])

    assert burst(10**9) == 125_000
    assert burst(10**6) == 4096  # an MTU-sized frame must fit, and a few more
    assert network.tbf_arguments(10**6)[-2:] == ["limit", "65536"]
    assert network.tbf_arguments(10**9)[-2:] == ["limit", "12500000"]  # 100 ms


def test_host_names_and_addresses():
    assert network.host_index("host12") == 12
    assert network.host_index(network.address(3)) == 3
    assert network.host_index("host01") is None and network.host_index("gpu1") is None
    with pytest.raises(network.ClusterError, match="prefix"):
        network.check_prefix("Bad-Prefix")


UP_TERMINATED = """
import os, signal, sys, time
from gossip_powersgd.cluster import network
made, removed = [], []
network.require_privileges = lambda: None
network.owned = lambda prefix: []
network._make_switch = lambda prefix: made.append("switch")
def make_host(prefix, k, count, bits):
    made.append(k)
    if k == 2:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        time.sleep(30)
network._make_host = make_host
network.down = lambda prefix: removed.append(prefix) or print("removed", made, flush=True)
network.up("rvt", 5, None, {})
"""


@pytest.mark.parametrize("sig, status", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_an_up_ended_by_sigterm_or_sighup_removes_what_it_made(sig, status):
    """`up` ended by SIGTERM or SIGHUP halfway (the hosts are plain functions here: no namespace
    is made) removes what it made, as on Ctrl-C, and ends with the status the signal's default
    action gives; before, the signal ended it at once and left every namespace made so far."""
    result = subprocess.run(
        [sys.executable, "-c", UP_TERMINATED, sig],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.stdout == "removed ['switch', 0, 1, 2]\n", result
    assert result.returncode == status, result.stderr


def test_termination_restores_the_handlers_it_replaced():
    before = signal.getsignal(signal.SIGTERM)
    with network.exits_on_termination():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


# ---- with namespaces -----------------------------------------------------------------------------
@needs_namespaces
def test_hosts_resolve_each_other_by_name_and_have_their_own(prefix, capsys):
    cli.run(
        ["up", "--prefix", prefix, "--hosts", "3", "--rate", "10mbit", "--rate-of", "host2=1mbit"]
    )
    table = capsys.readouterr().out
    for k, rate in enumerate(("10Mbit", "10Mbit", "1Mbit")):
        assert re.search(rf"^host{k} +192\.168\.77\.{k + 1} +{rate} +up +-$", table, re.M), table
    # every host resolves every other and calls itself by its own name; gloo's interface towards
    # host0 is each host's eth0 (on host0 too: its own address is on eth0, not on lo)
    code = (
        "import runpy, socket, sys\n"
        "towards = runpy.run_path(sys.argv[1])['interface_towards']\n"
        "print(socket.gethostname(), [socket.gethostbyname(f'host{k}') for k in range(3)],"
        " towards('host0'))"
    )
    for k in range(3):
        result = in_host(prefix, f"host{k}", code, str(INTERFACES))
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [
            f"host{k}",
            "['192.168.77.1',",
            "'192.168.77.2',",
            "'192.168.77.3']",
            "eth0",
        ]
    with pytest.raises(network.ClusterError, match="has no host 'host3'"):
        enter_command(prefix, "host3", ["true"])


@needs_namespaces
def test_down_after_up_was_killed_midway_leaves_nothing(prefix):
    up = subprocess.Popen(
        [sys.executable, "-m", "gossip_powersgd.cluster", "up", "--prefix", prefix]
        + ["--hosts", "60"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    second = network.NETNS_RUN / f"{prefix}-host1"
    deadline = time.monotonic() + 120
    while not second.exists() and up.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    running = up.poll() is None
    os.killpg(up.pid, signal.SIGKILL)  # the tool and any ip command it is running
    up.wait()
    made = left_of(prefix)
    assert running and second.exists(), "up ended before it could be killed midway"
    assert f"{prefix}-host59" not in made  # midway: some hosts, not all
    network.down(prefix)  # the fixture checks that nothing is left


@needs_namespaces
@pytest.mark.timing
def test_a_hosts_rate_limits_what_it_sends_and_what_it_receives(prefix):
    """tbf lets a TCP stream carry at most rate x 1448/1514 of payload (the Ethernet frame it
    counts, the headers it carries) plus its burst; the band's low side allows the stream its
    start and a loaded machine 10 %. Unlimited, the same link carries 10x more at least."""
    rate = 10**7
    network.up(prefix, 3, None, {"host1": rate})
    expected = rate * PAYLOAD_SHARE
    nbytes = 3_000_000  # 2.5 s at the rate
    seconds = nbytes * 8 / expected
    top = expected + (network.MIN_BURST + 1514) * 8 / seconds
    for source, dest in (("host1", "host0"), ("host0", "host1")):  # its egress, its ingress
        measured = throughput(prefix, source, dest, nbytes)
        assert 0.9 * expected <= measured <= top * 1.01, (source, dest, measured / expected)
    assert throughput(prefix, "host0", "host2", 30_000_000) > 10 * rate
    network.set_rate(prefix, "host1", None)
    assert throughput(prefix, "host0", "host1", 30_000_000) > 10 * rate


@needs_namespaces
def test_gloo_binds_where_other_hosts_reach_it_when_the_hostname_is_loopback(prefix):
    """Hostnames written as 127.0.1.1 (Debian's /etc/hosts): left to itself, gloo binds ranks 0
    and 2 on host0 to loopback and rank 1 on host1 fails connecting to 127.0.0.1 (seen with
    torch 2.13: "Connection refused, remote=[127.0.0.1]"); the interface towards the master, or,
    on the master's host, towards a rank on another host, is each host's eth0."""
    network.up(prefix, 2, None, {})
    for k in range(2):
        hosts = network.NETNS_ETC / f"{prefix}-host{k}" / "hosts"
        hosts.write_text(f"127.0.1.1\thost{k}\n" + hosts.read_text())
    env = {**os.environ, "WORLD_SIZE": "3", "MASTER_ADDR": "host0", "MASTER_PORT": "29500"}
    env.pop("GLOO_SOCKET_IFNAME", None)
    script = [sys.executable, str(ROOT / "tests" / "support" / "cluster_gloo.py")]
    ranks = [
        subprocess.Popen(
            enter_command(prefix, f"host{rank % 2}", script),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "RANK": str(rank)},
        )
        for rank in range(3)
    ]
    outputs = [p.communicate(timeout=180) for p in ranks]
    for rank, (out, err) in enumerate(outputs):
        assert out.split() == [str(rank), f"host{rank % 2}", "eth0", "6.0"], err[-2000:]


# ---- the documented launches across hosts --------------------------------------------------------
#: The guide that shows launches across machines (moved there from the README).
ACROSS_MACHINES = ROOT / "docs" / "guides" / "across-machines.md"


def readme_block() -> str:
    """The guide's commands across emulated hosts (its one bash block, under "Try it on one
    machine")."""
    text = ACROSS_MACHINES.read_text()
    section = re.search(r"## Try it on one machine.*?\n(.*?)(?:\n## |\Z)", text, re.S).group(1)
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_readme_block_launches_both_ways_on_four_hosts():
    block = readme_block()
    assert "cluster up --hosts 4" in block and "cluster down" in block
    assert "-launcher ssh -launcher-exec .venv/bin/gossip-cluster-ssh" in block
    assert "--nnodes 4 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint host0:" in block


@needs_namespaces
@pytest.mark.mpi
@pytest.mark.torchrun
@pytest.mark.slow  # 45-85 s on the shared 2-core machine: some 20 processes each load torch
def test_readme_launches_across_hosts_equal_the_in_process_backend(prefix, tmp_path):
    """The guide's block, run as printed (its .venv/bin/ is this venv's; in a fresh directory):
    mpiexec and torchrun on 4 hosts, one peer each, give the in-process backend's models."""
    from experiments.train import run

    local = run(["--config", "tiny", "--quiet", "--set", f"out_dir={tmp_path / 'local'}"])
    script = readme_block().replace(".venv/bin/", f"{BIN}/")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, network.PREFIX_ENV: prefix, "OMP_NUM_THREADS": "1"}
    result = run_bounded(["bash", "-e", "-c", script], 600, "the guide's block", cwd=work, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for launch in ("across-mpi", "across-torch"):
        summary = json.loads((work / "runs" / launch / "summary.json").read_text())
        assert summary["model_sha256"] == local["model_sha256"], launch
        assert summary["provenance"]["peers_per_host"] == {f"host{k}": 1 for k in range(4)}
    assert not left_of(prefix)  # the block's own `down`
