"""The scaling benchmark's points, the child process that runs each one, and the CLI.

Every point runs in a fresh child (one process for the in-process transport, `mpiexec -n N` or
`torchrun --nproc-per-node N` for the others), so that its memory is its own and a crash or a hang
(bounded by `--timeout`) costs one point, not the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from .measure import KINDS, parameter_shapes

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

ROOT = Path(__file__).resolve().parents[2]
# Pages go to experiments/results/ only when --out names it; by default under runs/ (git-ignored).
DEFAULT_OUT = ROOT / "runs" / "bench_scale.md"

#: The all-gather reduction holds n copies of the tensor on each of n peers; in one process that is
#: n^2 copies, so in-process points above this many gathered bytes skip it (and say so).
GATHER_BUDGET_BYTES = 2 * 2**30


@dataclasses.dataclass
class Point:
    """One measurement: `kinds` on ring:`peers` over `backend`, parameter set `params`."""

    section: str  # "peers" (cost vs n) or "size" (cost vs model size)
    backend: str  # "local", "mpi" or "torch"
    peers: int
    params: str  # "resnet20" or a parameter count such as "1e6"
    steps: int
    kinds: Sequence[str] = KINDS

    def label(self) -> str:
        return f"{self.section}: {self.backend} ring:{self.peers} {self.params}"


def tensor_bytes(params: str) -> int:
    """float32 bytes of one peer's parameters in the set `params`."""
    return 4 * sum(math.prod(shape) for _, shape in parameter_shapes(params))


def with_gather_rule(point: Point, skipped: List[str]) -> Point:
    """Drop the all-gather reduction from an in-process point whose n^2 copies exceed the budget."""
    if point.backend != "local" or "gather" not in point.kinds:
        return point
    if point.peers**2 * tensor_bytes(point.params) <= GATHER_BUDGET_BYTES:
        return point
    skipped.append(
        f"{point.label()}: all-gather reduction skipped ({point.peers}² copies of "
        f"{tensor_bytes(point.params) / 1e6:.2f} MB exceed the {GATHER_BUDGET_BYTES >> 30} "
        "GiB in-process budget)"
    )
    return dataclasses.replace(point, kinds=[k for k in point.kinds if k != "gather"])


#: In-process, the point-to-point ring and the all-gather reduction of the reductions table are
#: 2(n-1) sequential messages per peer, n^2 queue hand-offs between threads on the shared cores: at
#: 256 peers they alone outlast a point's time limit, so that point leaves them out. The all-reduce
#: and PowerSGD rows run (in-process their all-reduce goes through shared memory).
BIG_POINT_KINDS = ("exact", "powergossip", "allreduce", "powersgd")
PLAN_NOTES = [
    "peers: local ring:256 resnet20: the reductions table's point-to-point ring and all-gather "
    "skipped (in-process they cost n² thread hand-offs per step and did not finish within "
    "420 s); the four algorithms are measured"
]


def full_plan() -> List[Point]:
    """What `python -m experiments.bench_scale` measures (about 15 minutes on 2 shared cores)."""
    plan = [
        Point("peers", "local", n, "resnet20", 4 if n <= 64 else 2) for n in (8, 16, 32, 64, 128)
    ]
    plan.append(Point("peers", "local", 256, "resnet20", 2, BIG_POINT_KINDS))
    for backend in ("mpi", "torch"):
        plan += [Point("peers", backend, n, "resnet20", 4) for n in (2, 4, 8, 16)]
    plan += [Point("size", "local", 4, p, 4) for p in ("1e4", "1e5", "1e6", "1e7")]
    plan += [Point("size", "local", 2, "1e7", 4), Point("size", "local", 2, "1e8", 2)]
    return plan


def tiny_plan() -> List[Point]:
    """A few seconds' worth of the same code path (the smoke test's)."""
    return [Point("peers", "local", n, "1e3", 2) for n in (2, 4)] + [
        Point("size", "local", 2, p, 2) for p in ("1e3", "1e4")
    ]


# ---- one point in a child ----------------------------------------------------------------------
def point_command(point: Point, folder: Path) -> List[str]:
    """The command line that runs `point` and leaves rank-K.json files in `folder`."""
    child = [
        "-m",
        "experiments.bench_scale",
        "--point",
        json.dumps(dataclasses.asdict(point)),
        "--point-dir",
        str(folder),
    ]
    if point.backend == "local":
        return [sys.executable, *child]
    if point.backend == "mpi":
        mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
        return [mpiexec, "-n", str(point.peers), sys.executable, *child]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(point.peers),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *child,
    ]


def run_point(point: Point, timeout: float) -> Dict[str, Any]:
    """Run one point in its child; its per-rank records, or the one-line reason it failed."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    with tempfile.TemporaryDirectory(prefix="bench_scale-") as folder:
        start = time.perf_counter()
        child = subprocess.Popen(
            point_command(point, Path(folder)),
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return {"point": dataclasses.asdict(point), "error": f"no result within {timeout:g} s"}
        record: Dict[str, Any] = {
            "point": dataclasses.asdict(point),
            "wall": time.perf_counter() - start,
        }
        files = sorted(Path(folder).glob("rank-*.json"), key=lambda f: int(f.stem.split("-")[1]))
        if child.returncode != 0 or len(files) != point.peers:
            lines = [line for line in err.strip().splitlines() if line.strip()] or ["(no output)"]
            record["error"] = f"exit {child.returncode}: {lines[-1][:300]}"
            return record
        record["ranks"] = [json.loads(f.read_text()) for f in files]
        return record


def child_main(point_json: str, folder: str) -> int:
    """Inside the child: run the point on every peer, each rank writing its record."""
    import topologies
    from gossip_powersgd.launch import run_peers

    point = Point(**json.loads(point_json))
    values = run_peers(
        topologies.ring(point.peers), _peer, point, folder, backend=point.backend, timeout=600
    )
    return 0 if values else 1


def _peer(comm: Comm, point: Point, folder: str) -> bool:
    from gossip_powersgd.utils import atomic_write

    from .measure import peer_point

    record = peer_point(comm, point.kinds, point.params, point.steps)
    # in-process: whether the peer threads took turns (LocalCluster's default when peers outnumber cores)
    record["takes_turns"] = bool(getattr(comm, "takes_turns", False))
    atomic_write(Path(folder) / f"rank-{comm.rank}.json", json.dumps(record))
    return True


def merged(path: Path, records: List[Dict[str, Any]], meta: Dict[str, Any]):
    """The earlier run's records with this run's points replacing theirs, and both runs' metadata."""
    if not path.exists():
        raise ValueError(
            f"--merge needs the earlier run's {path.name} beside --out; run without --merge first"
        )
    earlier = json.loads(path.read_text())
    new = {Point(**r["point"]).label(): r for r in records}
    kept = [r for r in earlier["records"] if Point(**r["point"]).label() not in new]
    old = earlier["meta"]
    # the later run's load: its points were timed on a machine as shared as this one said
    load = re.search(r"load average at start [\d.]+, at end [\d.]+", meta.get("machine", ""))
    combined = {
        **old,
        "command": f"{old['command']}, then {meta['command']} ({meta['date']}, "
        f"{meta['seconds']:.0f} s" + (f", {load.group(0)}" if load else "") + ")",
        "seconds": old["seconds"] + meta["seconds"],
        "commit": f"{old.get('commit', 'not recorded')}, then {meta['commit']}",
        # an earlier note about a re-measured point no longer describes it
        "skipped": sorted(
            {
                note
                for note in old.get("skipped", [])
                if not any(note.startswith(f"{label}: ") for label in new)
            }
            | set(meta["skipped"])
        ),
    }
    order = {point.label(): k for k, point in enumerate(full_plan())}
    combined_records = sorted(
        kept + records, key=lambda r: order.get(Point(**r["point"]).label(), len(order))
    )
    return combined_records, combined


def rounded(obj: Any, digits: int = 5) -> Any:
    """`obj` with every float rounded to `digits` significant digits (a compact raw file)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    return obj


def raw_json(obj: Any) -> str:
    """The raw records, one line per point, floats to 5 significant digits."""
    records = ",\n".join(json.dumps(r, separators=(",", ":")) for r in rounded(obj["records"]))
    return '{"meta": ' + json.dumps(obj["meta"]) + ',\n"records": [\n' + records + "\n]}\n"


def render_only(out: Path) -> int:
    """Rewrite the page from the json beside it (after a change to the report's layout)."""
    from gossip_powersgd.utils import atomic_write

    from .report import render_markdown

    path = out.with_suffix(".json")
    if not path.exists():
        raise ValueError(f"--render needs {path.name} beside --out; run the benchmark first")
    data = json.loads(path.read_text())
    atomic_write(out, render_markdown(data["records"], data["meta"]))
    print(f"wrote {out} from {path.name}")
    return 0


# ---- the CLI -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_scale",
        description="Time per step and bytes per rank vs number of peers and vs model size for exact "
        "gossip, PowerGossip r1, all-reduce and centralized PowerSGD, and the ring "
        "all-reduce next to the all-gather reduction.",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="markdown page (a .json beside it)")
    parser.add_argument(
        "--plan",
        choices=("full", "tiny"),
        default="full",
        help="full: the committed page's points; tiny: a few seconds (smoke test)",
    )
    parser.add_argument("--quick", action="store_true", help="the same as --plan tiny")
    parser.add_argument("--only", choices=("local", "mpi", "torch"), help="one transport's points")
    parser.add_argument(
        "--points", help="only these points, as BACKEND:PEERS[,...] (e.g. local:256)"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace the measured points in the existing --out page and json, keep the rest",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="only rewrite the --out page from its json (no measurement)",
    )
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per point")
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--point-dir", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the plan and write the page; print one line per point as it finishes."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.plan = "tiny"
    if args.point:
        return child_main(args.point, args.point_dir)
    if args.render:
        return render_only(Path(args.out))
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive seconds, got {args.timeout:g}")
    from gossip_powersgd.utils import atomic_write

    from .report import machine_line, render_markdown

    plan = full_plan() if args.plan == "full" else tiny_plan()
    if args.only:
        plan = [p for p in plan if p.backend == args.only]
    if args.points:
        wanted = {tuple(item.strip().split(":")) for item in args.points.split(",")}
        plan = [p for p in plan if (p.backend, str(p.peers)) in wanted]
        if not plan:
            raise ValueError(
                f"--points {args.points!r} selects no point of the {args.plan} plan "
                "(write BACKEND:PEERS, e.g. local:256)"
            )
    skipped: List[str] = list(PLAN_NOTES) if args.plan == "full" else []
    plan = [with_gather_rule(p, skipped) for p in plan]
    started, start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.perf_counter()
    load_start = os.getloadavg()[0]
    records = []
    for point in plan:
        record = run_point(point, args.timeout)
        records.append(record)
        status = record.get("error") or f"{record['wall']:.0f} s"
        print(f"{point.label()}: {status}", flush=True)
    command = (
        "python -m experiments.bench_scale"
        + (f" --plan {args.plan}" if args.plan != "full" else "")
        + (f" --only {args.only}" if args.only else "")
        + (f" --points {args.points}" if args.points else "")
        + (" --merge" if args.merge else "")
        + (f" --out {args.out}" if Path(args.out) != DEFAULT_OUT else "")
    )
    from experiments.engine.provenance import page_commit

    meta = {
        "command": command,
        "date": started,
        "seconds": time.perf_counter() - start,
        "machine": machine_line(load_start, os.getloadavg()[0]),
        "skipped": skipped,
        "commit": page_commit(),
    }
    out = Path(args.out)
    if args.merge:
        records, meta = merged(out.with_suffix(".json"), records, meta)
    records = rounded(records)  # the page is exactly what --render makes of the json
    atomic_write(out, render_markdown(records, meta))
    atomic_write(out.with_suffix(".json"), raw_json({"meta": meta, "records": records}))
    print(f"wrote {out} and {out.with_suffix('.json').name} ({meta['seconds']:.0f} s)")
    failed = [r for r in records if "error" in r]
    return 1 if failed and len(failed) == len(records) else 0
