"""cluster/measure.py: the receiver and sender that time one TCP stream between two hosts, run here
on this machine's loopback (between emulated hosts, against their rate limits:
tests/cluster/test_network.py)."""

import socket
import subprocess
import sys

from gossip_powersgd.cluster import measure


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_receiver_counts_every_byte_and_times_from_its_first_read():
    """Standard-library interpreters (-I -S, as on a host): the receiver reports all the bytes the
    sender wrote (an odd count: the last chunk is partial), its first read (at most 4 MiB) and the
    time from it to the last, which `_result` reads back."""
    python = [sys.executable, "-I", "-S", "-c"]
    port, nbytes = free_port(), 3 * (1 << 16) + 123
    receiver = subprocess.Popen(
        [*python, measure._RECEIVE, str(port), "30"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout.readline().strip() == "ready"
        sent = subprocess.run(
            [*python, measure._SEND, "127.0.0.1", str(port), str(nbytes), "30"], timeout=60
        )
        assert sent.returncode == 0
        total, first, seconds = measure._result(receiver.communicate(timeout=60)[0])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    assert total == nbytes and 0 < first <= min(nbytes, 1 << 22) and seconds >= 0
