"""What one peer measures at one point of the scaling benchmark, on any transport: time per step,
bytes sent and received per rank, and the process's memory, for each algorithm and reduction. As a
program it is one point's child (`python -m experiments.pages.bench_scale.measure POINT_JSON
FOLDER`): every peer writes its record to FOLDER/rank-K.json."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Sequence

import torch

import topologies
from experiments.pages._bench import Shapes, make_params, model_shapes, resident_bytes
from gossip_powersgd import AllReduce, ExactGossip, PowerGossip, PowerSGDAllReduce
from gossip_powersgd.comm.base import nbytes, reduce_in_rank_order
from gossip_powersgd.launch import run_peers
from gossip_powersgd.utils import atomic_write

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

#: The two reductions of one flat tensor a point can time, and the four algorithms (a `step()` each).
REDUCTIONS = ("ring", "gather")
ALGORITHMS = {"exact": (ExactGossip, {}), "powergossip": (PowerGossip, {"rank": 1})}
ALGORITHMS.update(
    allreduce=(AllReduce, {}), powersgd=(PowerSGDAllReduce, {"rank": 1, "start_iter": 0})
)


def parameter_shapes(params: str) -> Shapes:
    """A model's shapes ("resnet20", "vgg16") or, for a number such as "1e6", one square matrix of
    about that many parameters (every compressor acts on it; no change of layer shapes with size)."""
    try:
        side = max(2, round(math.sqrt(int(float(params)))))
    except ValueError:
        return model_shapes(params)
    return [("weight", (side, side))]


def gather_reduce_(comm: Comm, tensor: torch.Tensor) -> torch.Tensor:
    """The all-gather reduction the library used before its ring, on the transport's point-to-point
    primitive (the path of `comm.allreduce_`): every peer receives every other peer's whole tensor
    around the ring and averages the n copies in rank order. Kept to measure what the ring saves."""
    n, r = comm.size, comm.rank
    if n == 1:
        return tensor
    flat = tensor.detach().reshape(-1)
    copies: List[torch.Tensor] = [None] * n  # type: ignore[list-item]
    copies[r] = flat.clone()
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        outgoing = copies[(r - step) % n]
        incoming = torch.empty_like(flat)
        comm._sendrecv(right, outgoing, left, incoming)
        copies[(r - step - 1) % n] = incoming
        comm.stats.bytes_sent += nbytes(outgoing)
        comm.stats.messages_sent += 1
    flat.copy_(reduce_in_rank_order(copies, "mean"))
    return tensor


@contextlib.contextmanager
def counting_received(comm: Comm, counter: Dict[str, int]) -> Iterator[None]:
    """Add to counter["bytes"] the payload bytes this peer receives (gossip messages and ring or
    gather chunks; the torch transport's int64 headers are envelope and left out)."""
    exchange, sendrecv = comm._exchange, comm._sendrecv

    def counted_exchange(send, recv):
        exchange(send, recv)
        counter["bytes"] += sum(nbytes(buffer) for buffer in recv.values())

    def counted_sendrecv(dest, send, source, recv):
        sendrecv(dest, send, source, recv)
        if source is not None and recv.is_floating_point():
            counter["bytes"] += nbytes(recv)

    comm._exchange, comm._sendrecv = counted_exchange, counted_sendrecv
    try:
        yield
    finally:
        del comm._exchange, comm._sendrecv  # back to the class's methods


def build(kind: str, comm: Comm, shapes: Shapes):
    """(a zero-argument step function, the tensors it keeps alive) for one kind on this peer."""
    params = make_params(shapes, comm.rank)
    if kind in REDUCTIONS:
        flat = torch.cat([p.reshape(-1) for p in params])
        del params
        if kind == "ring":
            # In-process, `allreduce_` reaches the ring's bits through shared memory; this table
            # compares the two reductions on the point-to-point path every transport has.
            if hasattr(comm, "shared_memory_allreduce"):
                comm.shared_memory_allreduce = False
            return (lambda: comm.allreduce_(flat, "mean")), flat
        return (lambda: gather_reduce_(comm, flat)), flat
    if kind not in ALGORITHMS:
        raise ValueError(f"unknown kind {kind!r} (valid: {', '.join([*ALGORITHMS, *REDUCTIONS])})")
    for p in params if kind == "powersgd" else ():  # PowerSGD compresses the gradients
        p.grad = torch.randn_like(p)
    algorithm, options = ALGORITHMS[kind]
    algorithm = algorithm(params, comm, **options)
    return algorithm.step, algorithm


def measure_kind(comm: Comm, kind: str, shapes: Shapes, steps: int) -> Dict[str, Any]:
    """One warm-up step, then `steps` timed ones between barriers: seconds per step on this peer,
    bytes sent (transport counters) and received per step, and the process's RSS afterwards."""
    step, keep = build(kind, comm, shapes)
    step()  # warm-up: first-touch allocations, factor set-up
    received = {"bytes": 0}
    comm.barrier()
    sent0 = comm.stats.bytes_sent
    with counting_received(comm, received):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = time.perf_counter() - start
    out = dict(kind=kind, rank=comm.rank, steps=steps, seconds_per_step=seconds / steps)
    out.update(bytes_sent=(comm.stats.bytes_sent - sent0) / steps)
    out.update(bytes_received=received["bytes"] / steps, rss=resident_bytes())
    del step, keep
    vars(comm).pop("shared_memory_allreduce", None)  # back to the class default for the next kind
    comm.barrier()
    if comm.rank == 0:  # one collection per process suffices (in-process, every peer shares it)
        gc.collect()
    return out


def peer_point(comm: Comm, kinds: Sequence[str], params: str, steps: int) -> Dict[str, Any]:
    """Every kind in turn on this peer (each freed before the next starts); the point's record."""
    shapes = parameter_shapes(params)
    numel = sum(math.prod(shape) for _, shape in shapes)
    out: Dict[str, Any] = dict(rank=comm.rank, size=comm.size, params=params, numel=numel)
    out.update(rss_start=resident_bytes(), results=[])
    for kind in kinds:
        # PowerGossip alternates right and left half-steps: time whole power iterations.
        count = steps + steps % 2 if kind == "powergossip" else steps
        out["results"].append(measure_kind(comm, kind, shapes, count))
    out["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return out


def _peer(comm: Comm, point: Dict[str, Any], folder: str) -> bool:
    record = peer_point(comm, point["kinds"], point["params"], point["steps"])
    # in-process: whether the threads took turns (LocalCluster's default, peers outnumbering cores)
    record["takes_turns"] = bool(getattr(comm, "takes_turns", False))
    atomic_write(Path(folder) / f"rank-{comm.rank}.json", json.dumps(record))
    return True


def _main(config: str, folder: str) -> int:
    """One point's child: every peer of it, here or as this rank."""
    point = json.loads(config)
    ring = topologies.ring(point["peers"])
    return 0 if run_peers(ring, _peer, point, folder, backend=point["backend"], timeout=600) else 1


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(_main, *sys.argv[1:])
