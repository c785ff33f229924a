"""What the benchmark measures on each peer: bytes and times of exact gossip and PowerGossip, copy
bandwidth, one peer's half-steps alone on a loopback transport, and the kernels of one half-step."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .shapes import Shapes, make_params, model_shapes

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm
    from topologies import AnyTopology


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return float(statistics.median(values)) if values else float("nan")


def loopback_communicator(topology: AnyTopology, rank: int):
    """A transport for one peer alone: every neighbour 'answers' with half of what we sent it.

    The algorithm runs its real code path (products, exchange, factor forming, updates), but nothing
    waits for another peer and no other peer competes for the CPU. The answer is cheap (a few kB)
    and counted as communication time, so it does not inflate the compute time.
    """
    import torch

    from gossip_powersgd.comm.base import Communicator

    class LoopbackCommunicator(Communicator):
        def _exchange(self, send, recv):
            for j in self.neighbors:
                torch.mul(send[j], 0.5, out=recv[j])

        def _allgather_tensor(self, tensor):
            return [tensor.detach().clone() for _ in range(self.size)]

    return LoopbackCommunicator(topology, rank, None)


def copy_bandwidth(megabytes: int, rounds: int = 1, buffers=None) -> List[float]:
    """GB/s of `dst.copy_(src)` on `megabytes` MB (read + write: 2 x bytes / time), per round."""
    import torch

    if buffers is None:
        src = torch.ones(megabytes * 2**20 // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)  # first touch
    else:
        src, dst = buffers
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        dst.copy_(src)
        out.append(2 * src.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return out


def block_order(names: Sequence[str], rep: int) -> List[str]:
    """The variants' order in repetition `rep`: alternating (A B, B A, ...) so that drift of the
    shared machine cancels; with a "before" variant, "batched" and "before" also swap places every
    second pair of repetitions, so each of the two is the first block after the copy (cold caches)
    as often as the other."""
    order = list(names) if rep % 2 == 0 else list(names)[::-1]
    if "before" in order and (rep // 2) % 2 == 1:
        i, j = order.index("batched"), order.index("before")
        order[i], order[j] = order[j], order[i]
    return order


def run_block(algorithm, comm: Comm, steps: int) -> Dict[str, Any]:
    """`steps` gossip steps; per step: side, bytes counted by the transport and by the formula, and
    the algorithm's accumulator deltas (total, communication)."""
    records = []
    wall = time.perf_counter()
    for _ in range(steps):
        side = "right" if getattr(algorithm, "half_steps", 1) % 2 == 0 else "left"
        if not hasattr(algorithm, "half_steps"):
            side = "full"
        expected = algorithm.bytes_per_step()
        b0, t0, c0 = comm.stats.bytes_sent, algorithm.time_total, algorithm.time_communication
        algorithm.step()
        records.append(
            {
                "side": side,
                "bytes": comm.stats.bytes_sent - b0,
                "expected": expected,
                "total": algorithm.time_total - t0,
                "comm": algorithm.time_communication - c0,
            }
        )
    return {"steps": records, "wall": time.perf_counter() - wall}


def even_steps(n: int) -> int:
    """`n` rounded up to an even count (whole power iterations), at least 2."""
    return max(2, n + (n % 2))


@dataclasses.dataclass
class BenchConfig:
    """One setting: a parameter set on a topology and a backend, and how long to measure."""

    model: str
    topology: str
    backend: str
    steps: int  # measured PowerGossip steps per variant (split into `reps` interleaved blocks)
    reps: int
    naive: bool
    exact_steps: int = 1
    warmup: int = 1
    rank: int = 1
    concurrent_copy_mb: int = 64  # per peer, all peers at once
    isolated_copy_mb: int = 256
    isolated: bool = True
    bytes_only: bool = False
    shapes: Optional[Shapes] = None  # overrides `model` (tests use a tiny parameter set)
    # A commit whose PowerGossip (with its own helper modules, `experiments.commit_code`) runs as
    # one more variant, "before", batched, in blocks interleaved with this tree's: old and new
    # timed side by side in one run, and their final parameters compared bit for bit.
    before: Optional[str] = None

    def parameter_shapes(self) -> Shapes:
        """The shapes to gossip: `shapes` if given, else the model's."""
        return self.shapes if self.shapes is not None else model_shapes(self.model)

    @property
    def block(self) -> int:
        """Steps per measured block."""
        return even_steps(max(1, self.steps // self.reps))


def peer_benchmark(comm: Comm, cfg: BenchConfig) -> Dict[str, Any]:
    """What one peer measures in the n-peer run (both transports call this, one call per peer)."""
    import torch

    from gossip_powersgd import ExactGossip, PowerGossip

    base = make_params(cfg.parameter_shapes(), comm.rank)
    out: Dict[str, Any] = {"rank": comm.rank, "degree": len(comm.neighbors)}

    # Exact gossip: bytes from the counters, and a time reference. Freed before PowerGossip starts.
    exact_params = [t.clone() for t in base]
    exact = ExactGossip(exact_params, comm)
    comm.barrier()
    if cfg.exact_steps > 1:
        run_block(exact, comm, 1)  # warm-up (first-touch allocations)
        comm.barrier()
    out["exact"] = run_block(exact, comm, cfg.exact_steps)
    out["exact_warmup"] = cfg.exact_steps > 1
    out["exact"]["param_bytes"] = sum(t.numel() * t.element_size() for t in exact_params)
    del exact, exact_params

    variants = {"batched": True}
    if cfg.before is not None and not cfg.bytes_only:
        variants["before"] = True
    if cfg.naive and not cfg.bytes_only:
        variants["naive"] = False
    gossips = {}
    for name, batched in variants.items():
        params = [t.clone() for t in base]
        algorithm = before_powergossip(cfg.before) if name == "before" else PowerGossip
        gossips[name] = algorithm(params, comm, rank=cfg.rank, batch_neighbors=batched)
    del base
    first = gossips["batched"]
    out["compressed_fraction"] = first.compressed_fraction
    out["param_bytes"] = sum(t.numel() * t.element_size() for t in first.params)
    out["compressed_bytes"] = sum(
        t.numel() * t.element_size()
        for k, t in enumerate(first.params)
        if k in first.compressed_indices
    )
    out["gamma"] = first.gamma

    if cfg.bytes_only:
        comm.barrier()
        out["variants"] = {"batched": [run_block(first, comm, 2)]}
        out["bandwidth_concurrent"] = []
        return out

    for g in gossips.values():
        comm.barrier()
        run_block(g, comm, cfg.warmup)

    copy_buffers = (
        torch.ones(cfg.concurrent_copy_mb * 2**20 // 4),
        torch.empty(cfg.concurrent_copy_mb * 2**20 // 4),
    )
    copy_buffers[1].copy_(copy_buffers[0])
    out["variants"] = {name: [] for name in gossips}
    out["bandwidth_concurrent"] = []
    names = list(gossips)
    for rep in range(cfg.reps):
        comm.barrier()  # every peer copies at the same time: the bandwidth each gets in this setting
        out["bandwidth_concurrent"] += copy_bandwidth(cfg.concurrent_copy_mb, 1, copy_buffers)
        for name in block_order(names, rep):
            comm.barrier()
            out["variants"][name].append(run_block(gossips[name], comm, cfg.block))
    if "before" in gossips:
        from ..commit_code import loaded_modules

        out["before"] = compare_params(gossips["batched"].params, gossips["before"].params)
        out["before"]["modules"] = loaded_modules(cfg.before)
    return out


def before_powergossip(commit: str) -> type:
    """`commit`'s PowerGossip with its own helper modules (loaded once per process); a one-line
    error when it cannot be read."""
    from ..commit_code import previous_powergossip

    algorithm = previous_powergossip(commit, helpers=True)
    if algorithm is None:
        raise ValueError(
            f"--before {commit}: cannot read gossip_powersgd/algorithms/powergossip.py at that "
            "commit with git; name a commit of this repository's history (run from a clone)"
        )
    return algorithm


def compare_params(new: Sequence[Any], old: Sequence[Any]) -> Dict[str, Any]:
    """Whether two parameter lists are bit-identical (their bytes, so -0.0 differs from 0.0 and
    NaNs compare by payload), and their largest absolute difference."""
    import torch

    def raw(t):
        return t.detach().contiguous().view(-1).view(torch.uint8)

    identical = len(new) == len(old) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(raw(a), raw(b))
        for a, b in zip(new, old)
    )
    difference = max(
        (float((a - b).abs().max()) for a, b in zip(new, old) if a.numel()), default=0.0
    )
    return {"identical": identical, "max_difference": difference}


def isolated_benchmark(cfg: BenchConfig, topology: AnyTopology) -> Dict[str, Any]:
    """Peer 0's half-steps alone (loopback transport, one thread), interleaved with one-thread copies
    of `isolated_copy_mb` MB: compute efficiency without oversubscription."""
    import torch

    from gossip_powersgd import PowerGossip

    comm = loopback_communicator(topology, 0)
    base = make_params(cfg.parameter_shapes(), 0)
    variants = {"batched": True}
    if cfg.before is not None:
        variants["before"] = True
    if cfg.naive:
        variants["naive"] = False
    gossips = {
        name: (before_powergossip(cfg.before) if name == "before" else PowerGossip)(
            [t.clone() for t in base], comm, rank=cfg.rank, batch_neighbors=b
        )
        for name, b in variants.items()
    }
    del base
    first = gossips["batched"]
    compressed = sum(
        t.numel() * t.element_size()
        for k, t in enumerate(first.params)
        if k in first.compressed_indices
    )
    for g in gossips.values():
        run_block(g, comm, cfg.warmup)
    src = torch.ones(cfg.isolated_copy_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    out: Dict[str, Any] = {
        "degree": len(comm.neighbors),
        "compressed_bytes": compressed,
        "threads": torch.get_num_threads(),
        "bandwidth": [],
        "variants": {name: [] for name in gossips},
    }
    names = list(gossips)
    for rep in range(cfg.reps):
        out["bandwidth"] += copy_bandwidth(cfg.isolated_copy_mb, 1, (src, dst))
        for name in block_order(names, rep):
            out["variants"][name].append(run_block(gossips[name], comm, cfg.block))
    return out


def kernel_benchmark(rounds: int = 7, columns: Sequence[int] = (1, 2, 3, 4)) -> Dict[str, Any]:
    """Time the kernels of one PowerGossip half-step on the largest VGG-16 group (five 512 x 4608
    matrices, 47 MB), one thread, each right after a 96 MB copy that it is compared with (the
    machine's load drifts): median over `rounds` of kernel GB/s / copy GB/s. `k` = deg x rank is the
    number of columns of the batched product (k = 1 is also what the naive path multiplies by)."""
    import torch
    import torch.nn.functional as F

    b, rows, cols = 5, 512, 4608
    M = torch.randn(b, rows, cols).mul_(cols**-0.5)
    nbytes = M.numel() * 4
    src = torch.ones(24 * 2**20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    # key -> (columns, display name, kernel, bytes it must move); reports look kernels up by key.
    cases: Dict[str, Tuple[int, str, Any, int]] = {}

    def add(key, name, fn, traffic):
        cases[f"k{k}.{key}"] = (k, name, fn, traffic)

    for k in columns:
        Q = torch.randn(b, cols, k)
        P = torch.randn(b, rows, k).mul_(1e-3)
        QT, PT = Q.transpose(1, 2).contiguous(), P.transpose(1, 2).contiguous()
        out_r, out_l, out_lt = (
            torch.empty(b, rows, k),
            torch.empty(b, cols, k),
            torch.empty(b, k, cols),
        )
        out_rt = torch.empty(b, k, rows)
        # What PowerGossip does now: factors stored vector-major (Q^T, P^T contiguous).
        add(
            "right.library",
            f"k={k} right: bmm(Q^T, M^T view) [library]",
            lambda QT=QT, o=out_rt: torch.bmm(QT, M.transpose(1, 2), out=o),
            nbytes,
        )
        add(
            "left.library",
            f"k={k} left: bmm(P^T, M) [library]",
            lambda PT=PT, o=out_lt: torch.bmm(PT, M, out=o),
            nbytes,
        )
        add(
            "update.library",
            f"k={k} update: baddbmm_(P^T view, Q^T) [library]",
            lambda PT=PT, QT=QT: M.baddbmm_(PT.transpose(1, 2), QT),
            2 * nbytes,
        )
        # The first formulation (factors stored rows x r), kept to show what the layout costs.
        add(
            "right.before",
            f"k={k} right: bmm(M, Q) [before]",
            lambda Q=Q, o=out_r: torch.bmm(M, Q, out=o),
            nbytes,
        )
        add(
            "left.before",
            f"k={k} left: bmm(M^T view, P) [before]",
            lambda P=P, o=out_l: torch.bmm(M.transpose(1, 2), P, out=o),
            nbytes,
        )
        add(
            "update.before",
            f"k={k} update: baddbmm_(P, Q^T view) [before]",
            lambda P=P, Q=Q: M.baddbmm_(P, Q.transpose(1, 2)),
            2 * nbytes,
        )
        add(
            "right.linear",
            f"k={k} right alt: per matrix linear(M_i, Q_i^T)",
            lambda QT=QT: [F.linear(M[i], QT[i]) for i in range(b)],
            nbytes,
        )
        add(
            "right.mv",
            f"k={k} right alt: per matrix, per column mv",
            lambda Q=Q, k=k: [torch.mv(M[i], Q[i, :, c]) for i in range(b) for c in range(k)],
            nbytes,
        )
        add(
            "left.mv",
            f"k={k} left alt: per matrix, per column mv(M_i^T)",
            lambda P=P, k=k: [torch.mv(M[i].t(), P[i, :, c]) for i in range(b) for c in range(k)],
            nbytes,
        )
    for _, _, fn, _ in cases.values():
        fn()
    ratios: Dict[str, List[float]] = {key: [] for key in cases}
    speeds: Dict[str, List[float]] = {key: [] for key in cases}
    copies: List[float] = []
    for _ in range(rounds):
        for key, (_, _, fn, traffic) in cases.items():
            copy = copy_bandwidth(0, 1, (src, dst))[0]
            start = time.perf_counter()
            fn()
            speed = traffic / (time.perf_counter() - start) / 1e9
            copies.append(copy)
            speeds[key].append(speed)
            ratios[key].append(speed / copy)
    return {
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "group": [b, rows, cols],
        "copy": median(copies),
        "copy_mb": src.numel() * 4 // 2**20,
        "kernels": [
            {
                "key": key,
                "k": k,
                "name": name,
                "gbps": median(speeds[key]),
                "of_copy": median(ratios[key]),
            }
            for key, (k, name, _, _) in cases.items()
        ],
    }
