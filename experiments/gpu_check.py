"""GPU readiness check: PowerGossip and exact gossip with CUDA tensors, against the CPU run.

    python -m experiments.gpu_check --out experiments/results/gpu_check.md   # on a CUDA machine
    python -m experiments.gpu_check --device cpu --dry-run   # the same code path on the CPU

On ring:P (P = --peers), ResNet-20 shapes (a few small matrices in a dry run): (1) the local
transport with every tensor on the device, exact gossip and PowerGossip r1 for --steps steps: the
final models must equal the CPU run's to float tolerance and the average over peers must stay
what it was; (2) the same under torchrun (`-m torch.distributed.run`, bounded by --timeout), one
process per GPU with NCCL (gloo in a dry run); (3) a VGG-16-shaped gossip step of both algorithms
timed on the device; (4) the page (default runs/gpu_check.md; a dry run writes only to --out).
Without CUDA it refuses in one line, exit status 1; with fewer than two GPUs (NCCL wants one per
rank) part (2) is reported as skipped, with the reason. Not an engine page: it has no committed
page (it needs a CUDA machine), and it exits non-zero when a comparison fails.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import torch

from experiments.engine import ROOT
from experiments.pages._bench import local_torchrun, make_params, model_shapes, run_child
from experiments.pages._markdown import fill, template

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

# Pages go to experiments/results/ only when --out names it; by default under runs/ (git-ignored).
DEFAULT_OUT = ROOT / "runs" / "gpu_check.md"
ALGORITHMS = ("exact", "powergossip")
#: Largest relative difference (2-norm over a peer's whole model) allowed between device and CPU
#: runs, and between the average over peers before and after gossip. float32 products summed in a
#: different order differ by ~1e-7 relative per operation; a few steps stay far below these.
MODEL_TOLERANCE = {"exact": 1e-5, "powergossip": 1e-4}
AVERAGE_TOLERANCE = 1e-5


def require_device(device: str, dry_run: bool) -> torch.device:
    """The device to check, or a one-line ValueError saying why this machine cannot run the check."""
    dev = torch.device(device)
    if dev.type == "cpu":
        if not dry_run:
            raise ValueError(
                "--device cpu checks the script, not a GPU: add --dry-run (and --out "
                "PATH to keep its page)"
            )
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device {device!r} is not supported: use cuda (or cpu with --dry-run)")
    if not torch.cuda.is_available():
        raise ValueError(
            f"gpu_check needs CUDA, and this machine has none (torch {torch.__version__}, "
            "torch.cuda.is_available() is False): run it on a GPU machine, or check the "
            "script itself with --device cpu --dry-run"
        )
    # TF32 would change the products' bits far beyond float tolerance; the check is for float32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return dev


def check_shapes(dry_run: bool):
    """ResNet-20 shapes, or in a dry run a few small matrices and a vector (seconds on a CPU)."""
    if dry_run:
        return [("a", (16, 24)), ("b", (16, 24)), ("c", (8, 3, 3, 3)), ("bias", (16,))]
    return model_shapes("resnet20")


def gossip_peer(comm: Comm, algorithm: str, shapes, steps: int, device: str) -> Dict[str, Any]:
    """One peer: `steps` steps of `algorithm` on its random parameters; its final model on the CPU
    and its seconds per step (after one warm-up step when steps > 1)."""
    from gossip_powersgd import ExactGossip, PowerGossip

    params = [t.to(device) for t in make_params(shapes, comm.rank)]
    gossip = (
        ExactGossip(params, comm) if algorithm == "exact" else PowerGossip(params, comm, rank=1)
    )
    seconds = []
    for _ in range(steps):
        comm.barrier()
        start = time.perf_counter()
        gossip.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    timed = seconds[1:] or seconds
    return dict(params=[p.detach().cpu().clone() for p in params], seconds=sum(timed) / len(timed))


def run_local(peers: int, algorithm: str, shapes, steps: int, device: str) -> List[Dict[str, Any]]:
    import topologies
    from gossip_powersgd import LocalCluster

    return LocalCluster(topologies.ring(peers), timeout=300).run(
        gossip_peer, algorithm, shapes, steps, device
    )


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def compare(
    runs: Sequence[Dict[str, Any]], reference: Sequence[Dict[str, Any]], shapes, algorithm: str
) -> Dict[str, Any]:
    """How far `runs` (one record per rank) is from the CPU `reference`, and how well it kept the
    average over peers; `ok` when both are within tolerance."""

    def flat(tensors) -> torch.Tensor:
        return torch.cat([t.reshape(-1).double() for t in tensors])

    diff = max(relative(flat(r["params"]), flat(ref["params"])) for r, ref in zip(runs, reference))
    start = torch.stack([flat(make_params(shapes, k)) for k in range(len(runs))]).mean(0)
    drift = relative(torch.stack([flat(r["params"]) for r in runs]).mean(0), start)
    ok = len(runs) == len(reference) and diff <= MODEL_TOLERANCE[algorithm]
    return dict(model_diff=diff, average_drift=drift, ok=ok and drift <= AVERAGE_TOLERANCE)


# ---- torch.distributed -----------------------------------------------------------------------------
def launch_torch(processes: int, args, folder: Path) -> str:
    """Run this program's workers under torchrun; '' on success, else the failure in one line."""
    command = [*local_torchrun(processes), "-m", "experiments.gpu_check"]
    command += ["--worker", str(folder), "--device", args.device, "--steps", str(args.steps)]
    status, err = run_child(command + (["--dry-run"] if args.dry_run else []), args.timeout)
    if status is None:
        return f"torchrun did not finish within {args.timeout:g} s"
    lines = [line for line in err.splitlines() if line.strip()] or ["(no output)"]
    errors = [line for line in lines if line.startswith("error")]
    return f"torchrun exit {status}: {(errors or lines)[-1][:300]}" if status else ""


def worker_main(folder: str, args) -> int:
    """Inside torchrun: both algorithms on a TorchCommunicator on this rank's device; the rank's
    records saved as rank-K.pt."""
    import topologies
    from gossip_powersgd.launch import run_peers

    def peer(comm: Comm):
        shapes, device = check_shapes(args.dry_run), str(comm.device)
        out = {name: gossip_peer(comm, name, shapes, args.steps, device) for name in ALGORITHMS}
        torch.save(out, Path(folder) / f"rank-{comm.rank}.pt")

    device = "cpu" if args.device == "cpu" else "cuda"
    ring = topologies.ring(int(os.environ["WORLD_SIZE"]))
    run_peers(ring, peer, backend="torch", timeout=args.timeout, device=device)
    return 0


def torch_rows(args, device: torch.device, shapes, reference) -> List[Dict[str, Any]]:
    """Part (2): both algorithms under torchrun against the CPU run (or why they were not run)."""
    gpus = torch.cuda.device_count() if device.type != "cpu" else args.peers
    processes = min(args.peers, gpus) if gpus >= 2 else 0
    if processes and processes != args.peers:
        reference = {
            name: run_local(processes, name, shapes, args.steps, "cpu") for name in ALGORITHMS
        }
    backend = "gloo" if device.type == "cpu" else "nccl"
    transport = f"torch/{backend}, {processes or args.peers} processes"
    why = f"NCCL wants one GPU per rank and this machine has {gpus}; run the check on a machine "
    why += "with at least two GPUs for this part"
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as folder:
        failure = launch_torch(processes, args, Path(folder)) if processes else ""
        for name in ALGORITHMS:
            row = dict(transport=transport, algorithm=name)
            if not processes:
                rows.append({**row, "skipped": why})
            elif failure:
                rows.append({**row, "error": failure, "ok": False})
            else:
                files = [Path(folder) / f"rank-{k}.pt" for k in range(processes)]
                runs = [torch.load(f, weights_only=True)[name] for f in files]
                rows.append({**row, **compare(runs, reference[name], shapes, name)})
    return rows


# ---- the page ------------------------------------------------------------------------------------
def _result(row: Dict[str, Any]) -> str:
    """A row of the comparison table (skipped, failed to run, or compared)."""
    if "skipped" in row or "error" in row:
        result = f"skipped: {row['skipped']}" if "skipped" in row else f"**FAIL**: {row['error']}"
        return f"| {row['transport']} | {row['algorithm']} | – | – | {result} |"
    return (
        f"| {row['transport']} | {row['algorithm']} | {row['model_diff']:.2e} | "
        f"{row['average_drift']:.2e} | {'pass' if row['ok'] else '**FAIL**'} |"
    )


def render(rows: List[Dict[str, Any]], timings: Dict[str, float], meta: Dict[str, Any]) -> str:
    """The page (its text: gpu_check.md beside this file)."""
    return fill(
        template(__file__, "gpu_check.md"),
        **meta,
        torch=torch.__version__,
        **MODEL_TOLERANCE,
        average=AVERAGE_TOLERANCE,
        rows=[_result(row) for row in rows],
        timings=[f"| {name} | {seconds * 1e3:.3g} ms |" for name, seconds in timings.items()],
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.gpu_check", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("--device", default="cuda", help="cuda (default) or cpu (with --dry-run)")
    small = "small shapes and the CPU allowed: checks the script, not a GPU"
    add("--dry-run", action="store_true", help=small)
    add("--peers", type=int, default=4, help="peers on the ring (default 4)")
    add("--steps", type=int, default=6, help="gossip steps per run (default 6)")
    add("--timeout", type=float, default=300.0, help="seconds for the torchrun part")
    out = "page to write (default runs/gpu_check.md; the committed page: --out "
    add("--out", help=out + "experiments/results/gpu_check.md; none in a dry run unless given)")
    add("--worker", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the check; print the page; exit 1 if any comparison failed."""
    args = build_parser().parse_args(argv)
    if args.peers < 2 or args.steps < 1 or args.timeout <= 0:
        raise ValueError("--peers must be >= 2, --steps >= 1 and --timeout > 0")
    device = require_device(args.device, args.dry_run)
    if args.worker:
        return worker_main(args.worker, args)
    from gossip_powersgd.utils import atomic_write

    start, date = time.perf_counter(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    shapes, on = check_shapes(args.dry_run), str(device)
    reference = {
        name: run_local(args.peers, name, shapes, args.steps, "cpu") for name in ALGORITHMS
    }
    rows = []
    for name in ALGORITHMS:
        runs = run_local(args.peers, name, shapes, args.steps, on)
        compared = compare(runs, reference[name], shapes, name)
        rows.append(dict(transport=f"local on {device.type}", algorithm=name, **compared))
    rows += torch_rows(args, device, shapes, reference)
    timing_set = shapes if args.dry_run else model_shapes("vgg16")
    timings = {
        name: sum(r["seconds"] for r in run_local(args.peers, name, timing_set, 3, on)) / args.peers
        for name in ALGORITHMS
    }
    command = (
        "python -m experiments.gpu_check" + f" --device {args.device} --dry-run" * args.dry_run
    )
    meta = dict(command=command + (f" --out {args.out}" if args.out else ""), date=date)
    meta.update(seconds=time.perf_counter() - start, peers=args.peers, steps=args.steps)
    cuda = device.type == "cuda"
    meta["device_name"] = torch.cuda.get_device_name(device) if cuda else "cpu (dry run)"
    meta["timing_shapes"] = (
        "small dry-run shapes" if args.dry_run else "VGG-16 shapes, 15.2 M parameters"
    )
    page = render(rows, timings, meta)
    out = args.out or (None if args.dry_run else str(DEFAULT_OUT))
    if out:
        atomic_write(Path(out), page)
    print(page + (f"\nwrote {out}" if out else ""))
    return 0 if all(row.get("ok", True) for row in rows) else 1


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(main)
