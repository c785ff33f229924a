"""What a link between two hosts carries: one TCP stream's payload rate, measured.

A receiver on the destination host reads everything one connection sends; the rate is the bytes
after its first read over the time from that read to the last (its reads take up to 4 MiB, so data
that queued while it was not scheduled counts with the first read instead of shortening the time).
A tbf rate R lets a TCP stream carry at most R x PAYLOAD_SHARE of payload: tbf counts each
packet's Ethernet frame (1514 bytes at MTU 1500), of which 1448 are payload (headers: IPv4 20,
TCP 20 + 12 of timestamps, Ethernet 14).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Tuple

from .enter import enter_command
from .network import ClusterError, require_host

PAYLOAD_SHARE = 1448 / 1514
PORT = 5201

_RECEIVE = """
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.listen(1)
server.settimeout(float(sys.argv[2]))
print("ready", flush=True)
connection, _ = server.accept()
connection.settimeout(float(sys.argv[2]))
total = first_size = 0
first = last = None
while True:
    data = connection.recv(1 << 22)
    if not data:
        break
    last = time.monotonic()
    if first is None:
        first, first_size = last, len(data)
    total += len(data)
print(total, first_size, (last - first) if first is not None else 0.0, flush=True)
"""

_SEND = """
import socket, sys
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
chunk, left = bytes(1 << 16), int(sys.argv[3])
while left > 0:
    connection.sendall(chunk[: min(left, len(chunk))])
    left -= len(chunk)
connection.close()
"""


def throughput(prefix: str, source: str, dest: str, nbytes: int, timeout: float = 120.0) -> float:
    """Payload bits per second of one TCP stream of `nbytes` from `source` to `dest`."""
    source, dest = require_host(prefix, source), require_host(prefix, dest)
    if source == dest:
        raise ClusterError(f"{source} to itself goes over loopback, not its link: pick two hosts")
    python = [sys.executable, "-I", "-S", "-c"]
    receiver = subprocess.Popen(
        enter_command(prefix, dest, [*python, _RECEIVE, str(PORT), str(timeout)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if receiver.stdout.readline().strip() != "ready":
            raise ClusterError(f"the receiver on {dest} did not start: {receiver.stderr.read()}")
        command = [*python, _SEND, dest, str(PORT), str(nbytes), str(timeout)]
        sent = subprocess.run(
            enter_command(prefix, source, command), capture_output=True, text=True, timeout=timeout
        )
        if sent.returncode != 0:
            raise ClusterError(f"sending from {source} failed: {sent.stderr.strip()[-300:]}")
        total, first, seconds = _result(receiver.communicate(timeout=timeout)[0])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    if total != nbytes or seconds <= 0:
        raise ClusterError(f"{dest} received {total} of {nbytes} bytes: too few to time")
    return (total - first) * 8 / seconds


def _result(line: str) -> Tuple[int, int, float]:
    total, first, seconds = line.split()
    return int(total), int(first), float(seconds)
