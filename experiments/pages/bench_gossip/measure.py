"""What the benchmark measures on each peer: bytes and times of exact gossip and PowerGossip, copy
bandwidth, one peer alone on a loopback transport, the kernels of one half-step. As a program, an
MPI setting's child (`mpiexec -n 8 python -m ...measure CONFIG OUT`): rank 0 writes every peer's."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import topologies
from experiments.pages._bench import LoopbackCommunicator, Shapes, compare_params, copy_bandwidth
from experiments.pages._bench import copy_buffers, make_params, median, model_shapes
from experiments.pages._commit_code import loaded_modules, previous_powergossip
from gossip_powersgd import ExactGossip, PowerGossip
from gossip_powersgd.launch import mpi_world, run_peers
from gossip_powersgd.utils import atomic_write

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm
    from topologies import AnyTopology


def block_order(names: Sequence[str], rep: int) -> List[str]:
    """The variants' order in repetition `rep`: alternating (A B, B A, ...) so that the shared
    machine's drift cancels; "batched" and "before" also swap places every second pair, so each is
    the first block after the copy (cold caches) as often as the other."""
    order = list(names) if rep % 2 == 0 else list(names)[::-1]
    if {"before", "batched"} <= set(order) and (rep // 2) % 2 == 1:
        i, j = order.index("batched"), order.index("before")
        order[i], order[j] = order[j], order[i]
    return order


def run_block(algorithm, comm: Comm, steps: int) -> Dict[str, Any]:
    """`steps` gossip steps; per step its side, bytes (transport, formula), accumulator deltas."""
    records = []
    wall = time.perf_counter()
    for _ in range(steps):
        half = getattr(algorithm, "half_steps", None)
        side = "full" if half is None else "right" if half % 2 == 0 else "left"
        expected = algorithm.bytes_per_step()
        b0, t0, c0 = comm.stats.bytes_sent, algorithm.time_total, algorithm.time_communication
        algorithm.step()
        record = dict(side=side, bytes=comm.stats.bytes_sent - b0, expected=expected)
        record.update(total=algorithm.time_total - t0, comm=algorithm.time_communication - c0)
        records.append(record)
    return {"steps": records, "wall": time.perf_counter() - wall}


@dataclasses.dataclass
class BenchConfig:
    """One setting: a parameter set on a topology and a backend, and how long to measure; `before`:
    a commit whose PowerGossip (`_commit_code`) runs as one more variant, compared bitwise."""

    model: str
    topology: str
    backend: str
    steps: int  # measured PowerGossip steps per variant (split into `reps` interleaved blocks)
    reps: int
    naive: bool
    exact_steps: int = 1
    warmup: int = 1
    concurrent_copy_mb: int = 64  # per peer, all peers at once
    isolated_copy_mb: int = 256
    bytes_only: bool = False
    shapes: Optional[Shapes] = None  # overrides `model` (tests use a tiny parameter set)
    before: Optional[str] = None

    def parameter_shapes(self) -> Shapes:
        """The shapes to gossip: `shapes` if given, else the model's."""
        return self.shapes if self.shapes is not None else model_shapes(self.model)

    @property
    def block(self) -> int:
        """Steps per measured block: an even count (whole power iterations), at least 2."""
        n = max(1, self.steps // self.reps)
        return max(2, n + (n % 2))


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def peer_benchmark(comm: Comm, cfg: BenchConfig) -> Dict[str, Any]:
    """What one peer measures in the n-peer run (both transports call this, one call per peer)."""
    base = make_params(cfg.parameter_shapes(), comm.rank)
    out: Dict[str, Any] = {"rank": comm.rank, "degree": len(comm.neighbors)}
    # Exact gossip: bytes from the counters, and a time reference. Freed before PowerGossip starts.
    exact = ExactGossip([t.clone() for t in base], comm)
    comm.barrier()
    if cfg.exact_steps > 1:
        run_block(exact, comm, 1)  # warm-up (first-touch allocations)
        comm.barrier()
    out.update(exact=run_block(exact, comm, cfg.exact_steps), exact_warmup=cfg.exact_steps > 1)
    out["exact"]["param_bytes"] = _bytes(exact.params)
    del exact
    gossips = build(variants(cfg), base, comm)
    del base
    first = next(iter(gossips.values()))
    out.update(compressed_fraction=first.compressed_fraction, param_bytes=_bytes(first.params))
    out.update(compressed_bytes=compressed_bytes(first), gamma=first.gamma)
    if cfg.bytes_only:
        comm.barrier()
        return dict(out, variants={"batched": [run_block(first, comm, 2)]}, bandwidth_concurrent=[])
    # every peer copies at the same time: the bandwidth each gets in this setting
    out["variants"], out["bandwidth_concurrent"] = interleaved_blocks(
        gossips, comm, cfg, cfg.concurrent_copy_mb, comm.barrier
    )
    if "before" in gossips:
        out["before"] = compare_params(gossips["batched"].params, gossips["before"].params)
        out["before"]["modules"] = loaded_modules(cfg.before)
    return out


def before_powergossip(commit: str) -> type:
    """`commit`'s PowerGossip with its own helper modules; a one-line error where git cannot."""
    if (algorithm := previous_powergossip(commit, helpers=True)) is not None:
        return algorithm
    raise ValueError(
        f"bench_gossip compares with {commit}'s PowerGossip and cannot read "
        "gossip_powersgd/algorithms/powergossip.py at that commit with git: run it from a "
        "clone of the repository with its history"
    )


def variants(cfg: BenchConfig) -> Dict[str, Tuple[type, bool]]:
    """A setting's PowerGossips: name -> (class, batch_neighbors); "batched" first."""
    out = {"batched": (PowerGossip, True)}
    if cfg.before is not None and not cfg.bytes_only:
        out["before"] = (before_powergossip(cfg.before), True)
    return dict(out, naive=(PowerGossip, False)) if cfg.naive and not cfg.bytes_only else out


def build(algorithms: Dict[str, Tuple[type, bool]], base, comm: Comm) -> Dict[str, Any]:
    """Each variant (rank 1) on its own copy of `base`."""
    return {
        name: algorithm([t.clone() for t in base], comm, rank=1, batch_neighbors=batched)
        for name, (algorithm, batched) in algorithms.items()
    }


def compressed_bytes(gossip) -> int:
    """Bytes of the parameters PowerGossip compresses (its matrices)."""
    return _bytes(t for k, t in enumerate(gossip.params) if k in gossip.compressed_indices)


def isolated_benchmark(
    cfg: BenchConfig, topology: AnyTopology, algorithms: Optional[Dict[str, Tuple]] = None
) -> Dict[str, Any]:
    """Peer 0's half-steps alone (loopback transport), interleaved with one-thread copies of
    `isolated_copy_mb` MB; `algorithms`: name -> (class, batch_neighbors), default `variants`."""
    comm = LoopbackCommunicator(topology, 0, None)
    params = make_params(cfg.parameter_shapes(), 0)
    gossips = build(algorithms or variants(cfg), params, comm)
    blocks, bandwidth = interleaved_blocks(gossips, comm, cfg, cfg.isolated_copy_mb, lambda: None)
    first = next(iter(gossips.values()))
    out = dict(degree=len(comm.neighbors), compressed_bytes=compressed_bytes(first))
    return dict(out, threads=torch.get_num_threads(), bandwidth=bandwidth, variants=blocks)


def interleaved_blocks(gossips: Dict[str, Any], comm: Comm, cfg: BenchConfig, copy_mb, barrier):
    """A warm-up block of every variant, then `cfg.reps` rounds of a one-thread copy of `copy_mb`
    MB (its GB/s) and a measured block of every variant (`block_order`), `barrier()` before each
    block and copy: ({variant: its blocks}, the copies' GB/s)."""
    for g in gossips.values():
        barrier()
        run_block(g, comm, cfg.warmup)
    buffers = copy_buffers(copy_mb)
    blocks: Dict[str, List[Dict[str, Any]]] = {name: [] for name in gossips}
    bandwidth: List[float] = []
    for rep in range(cfg.reps):
        barrier()
        bandwidth.append(copy_bandwidth(*buffers))
        for name in block_order(list(gossips), rep):
            barrier()
            blocks[name].append(run_block(gossips[name], comm, cfg.block))
    return blocks, bandwidth


#: The kernels of one half-step: key -> (display name, bytes it moves in units of M). "library":
#: what PowerGossip does (factors stored vector-major, Qᵀ and Pᵀ contiguous); "before": the first
#: formulation (factors stored rows x r); then per-matrix and per-column alternatives.
KERNELS = {
    "right.library": ("right: bmm(Q^T, M^T view) [library]", 1),
    "left.library": ("left: bmm(P^T, M) [library]", 1),
    "update.library": ("update: baddbmm_(P^T view, Q^T) [library]", 2),
    "right.before": ("right: bmm(M, Q) [before]", 1),
    "left.before": ("left: bmm(M^T view, P) [before]", 1),
    "update.before": ("update: baddbmm_(P, Q^T view) [before]", 2),
    "right.linear": ("right alt: per matrix linear(M_i, Q_i^T)", 1),
    "right.mv": ("right alt: per matrix, per column mv", 1),
    "left.mv": ("left alt: per matrix, per column mv(M_i^T)", 1),
}


def _kernel(key: str, M, k: int):
    """The kernel `key` on M (b x rows x cols) with k-column factors, as a function of nothing."""
    b, rows, cols = M.shape
    Q, P = torch.randn(b, cols, k), torch.randn(b, rows, k).mul_(1e-3)
    QT, PT = Q.transpose(1, 2).contiguous(), P.transpose(1, 2).contiguous()
    out = {"rt": torch.empty(b, k, rows), "lt": torch.empty(b, k, cols)}
    out.update(r=torch.empty(b, rows, k), l=torch.empty(b, cols, k))
    return {
        "right.library": lambda: torch.bmm(QT, M.transpose(1, 2), out=out["rt"]),
        "left.library": lambda: torch.bmm(PT, M, out=out["lt"]),
        "update.library": lambda: M.baddbmm_(PT.transpose(1, 2), QT),
        "right.before": lambda: torch.bmm(M, Q, out=out["r"]),
        "left.before": lambda: torch.bmm(M.transpose(1, 2), P, out=out["l"]),
        "update.before": lambda: M.baddbmm_(P, Q.transpose(1, 2)),
        "right.linear": lambda: [F.linear(M[i], QT[i]) for i in range(b)],
        "right.mv": lambda: [torch.mv(M[i], Q[i, :, c]) for i in range(b) for c in range(k)],
        "left.mv": lambda: [torch.mv(M[i].t(), P[i, :, c]) for i in range(b) for c in range(k)],
    }[key]


def kernel_benchmark(rounds: int) -> Dict[str, Any]:
    """Time the kernels of one half-step on the largest VGG-16 group (five 512 x 4608 matrices),
    one thread, each right after a 96 MB copy it is compared with (the load drifts): median over
    `rounds` of kernel GB/s / copy GB/s. `k` = deg x rank columns, 1 to 4 (1: the naive path's)."""
    b, rows, cols = 5, 512, 4608
    M = torch.randn(b, rows, cols).mul_(cols**-0.5)
    src, dst = copy_buffers(96)
    cases = {(k, key): _kernel(key, M, k) for k in (1, 2, 3, 4) for key in KERNELS}
    for fn in cases.values():
        fn()
    measured: Dict[Tuple[int, str], List[Tuple[float, float]]] = {case: [] for case in cases}
    for _ in range(rounds):  # (kernel GB/s, GB/s of the copy right before it) per round
        for (k, key), fn in cases.items():
            copy = copy_bandwidth(src, dst)
            start = time.perf_counter()
            fn()
            speed = KERNELS[key][1] * M.numel() * 4 / (time.perf_counter() - start) / 1e9
            measured[(k, key)].append((speed, copy))
    kernels = [
        dict(key=f"k{k}.{key}", k=k, name=f"k={k} {KERNELS[key][0]}")
        | dict(gbps=median([s for s, _ in pairs]), of_copy=median([s / c for s, c in pairs]))
        for (k, key), pairs in measured.items()
    ]
    out = dict(threads=torch.get_num_threads(), rounds=rounds, group=[b, rows, cols])
    copies = [copy for pairs in measured.values() for _, copy in pairs]
    return dict(out, copy=median(copies), copy_mb=src.numel() * 4 // 2**20, kernels=kernels)


def mpi_peer(comm: Comm, cfg: BenchConfig, topology: AnyTopology) -> Dict[str, Any]:
    """One rank's part of an MPI setting: its own numbers, then rank 0 measures the isolated
    half-steps while the others wait in a barrier (the MPI transport's waits sleep, leaving the
    cores alone); rank 0 gets every peer's numbers."""
    mine = peer_benchmark(comm, cfg)
    isolated = None
    if not cfg.bytes_only:
        comm.barrier()
        if comm.rank == 0:
            isolated = isolated_benchmark(cfg, topology)
        comm.barrier()
    data = json.dumps(mine).encode()  # every peer's, through the raw all-gather (padded)
    sizes = [
        int.from_bytes(b, "little") for b in comm.allgather_bytes(len(data).to_bytes(8, "little"))
    ]
    padded = comm.allgather_bytes(data + b" " * (max(sizes) - len(data)))
    return {"peers": [json.loads(p[:n]) for p, n in zip(padded, sizes)], "isolated": isolated}


def _main(config: str, out: str) -> int:
    """An MPI setting's child: this rank's part; rank 0 writes OUT."""
    torch.set_num_threads(1)
    cfg = BenchConfig(**json.loads(config))
    topology = topologies.parse(cfg.topology)
    started = time.perf_counter()
    result = next(iter(run_peers(topology, mpi_peer, cfg, topology, backend="mpi").values()))
    if mpi_world()[0] == 0:
        atomic_write(out, json.dumps(dict(result, seconds=time.perf_counter() - started)))
    return 0


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(_main, *sys.argv[1:])
