"""`python -m experiments.paper_standin [--quick] [--out DIR]`: the PowerGossip paper's ResNet-20
workload on a CIFAR-shaped synthetic stand-in (`synthetic_images`), ring:8, every row trained by
the library's own `train` on the local backend: all-reduce, exact gossip, PowerGossip rank 1 and
2 (and rank 1 with 2 power iterations), Choco-SGD with sign compression, and exact gossip with
local steps H = 4 and 16. Writes
paper_standin.md, .json and .csv (and a plot) into DIR (default runs/paper-standin, or
runs/paper-standin-quick with --quick; the committed page: --out experiments/results).

Also measured: the floats per exchange of PowerGossip r1 against exact gossip on ResNet-20 and
VGG-16 (two gossip rounds of each on ring:8, counted on the transport, next to the closed form),
and one ResNet-20 forward + backward at the paper's batch of 128 on one thread of this CPU, from
which the page projects the cost of a real CIFAR-10 run. ``--quick`` is a seconds-long smoke run
(ring:4, a width-4 ResNet-20, a few records; no VGG-16).
VGG-16's traffic is measured as the paper's model (`vgg16:bn=false`) and with BatchNorm.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

from gossip_powersgd.utils import atomic_write

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Comm

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "runs" / "paper-standin"
COMMAND = "python -m experiments.paper_standin"

#: The rows: (label, algorithm spec, local_steps). Choco's consensus step is the paper config's
#: (experiments/configs/paper/resnet20_cifar10_choco_sign.yaml); every other gamma is the topology's.
ROWS = (
    ("all-reduce", "allreduce", 1),
    ("exact gossip", "exact", 1),
    ("PowerGossip r1", "powergossip:rank=1", 1),
    ("PowerGossip r2", "powergossip:rank=2", 1),
    # the paper's grid also runs 2 power iterations: whether more iterations close r1's gap
    ("PowerGossip r1, 2 iterations", "powergossip:rank=1,iters=2", 1),
    ("Choco sign", "choco:compressor=sign,gamma=0.2", 1),
    ("exact gossip H=4", "exact", 4),
    ("exact gossip H=16", "exact", 16),
)

#: The training recipe of each mode; everything a row shares. `shard` is the records per peer.
SETTINGS: Dict[bool, Dict[str, Any]] = {
    False: dict(
        topology="ring:8",
        dataset="synthetic_images:n=2048,test=500,noise=0.7",
        model="resnet20",
        batch_size=16,
        lr=0.1,
        momentum=0.9,
        weight_decay=0.0001,
        warmup_epochs=1,
        schedule="cosine",
        epochs=8,
        eval_every=2,
        # VGG-16 as in the PowerGossip paper (no BatchNorm, conv biases), and with BatchNorm
        traffic_models=("vgg16:bn=false", "vgg16"),
    ),
    True: dict(
        topology="ring:4",
        dataset="synthetic_images:n=96,test=16,noise=1.0",
        model="resnet20:width=4",
        batch_size=3,
        lr=0.1,
        momentum=0.9,
        weight_decay=0.0001,
        warmup_epochs=0,
        schedule="cosine",
        epochs=2,
        eval_every=1,
        traffic_models=(),
    ),
}
#: The paper's CIFAR-10 run, for the projection: 300 epochs of 50,000 images, 8 peers x 128.
PAPER_EPOCHS, CIFAR_TRAIN, PAPER_PEERS, PAPER_BATCH = 300, 50_000, 8, 128


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def train_row(setting: Dict[str, Any], label: str, spec: str, local_steps: int) -> Dict[str, Any]:
    """One row: train on every peer (threads of this process) and keep its measurements."""
    from gossip_powersgd import run

    keys = ("topology", "dataset", "model", "batch_size", "lr", "momentum", "weight_decay")
    keys += ("warmup_epochs", "schedule", "epochs", "eval_every")
    data = {k: setting[k] for k in keys}
    data.update(
        algorithm=spec,
        local_steps=local_steps,
        optimizer="sgd",
        seed=setting.get("seed", 0),
        backend="local",
        quiet=True,
        log_every=0,
        checkpoint_every=0,
        out_dir=None,
        threads=1,
        comm_timeout=1800.0,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    result = run(data)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary = dict(result.summary, history=result.history)
    steps = int(summary["steps"])
    evals = [
        {
            "epoch": r["epoch"],
            "step": r["step"],
            "mb": r["mb_sent_per_peer"],
            "acc_avg": r["test_acc_avg_model"],
            "acc_local_mean": r["test_acc_mean"],
            "acc_local_min": r["test_acc_min"],
            "consensus_distance": r["consensus_distance"],
            "train_loss": r.get("train_loss"),
        }
        for r in summary["history"]
        if r.get("kind") == "eval"
    ]
    return {
        "label": label,
        "algorithm": spec,
        "local_steps": local_steps,
        "steps": steps,
        "rounds": summary["communication_rounds"],
        "parameters": summary["parameters"],
        "acc_avg": summary["final_test_acc_avg_model"],
        "acc_local_mean": summary["final_test_acc_local_mean"],
        "consensus_distance": summary["final_consensus_distance"],
        "mb_per_peer": summary["mb_sent_per_peer"],
        "exact_mb_formula": summary["exact_gossip_mb_per_peer_formula"],
        # per peer, seconds inside forward/backward/optimizer and inside the gossip's arithmetic
        "compute_s_per_step": summary["time_compute_s"] / steps,
        "gossip_compute_s_per_step": summary["time_gossip_compute_s"] / steps,
        "wall_s_per_step": summary["wall_time_s"] / steps,  # training loop incl. evaluations
        "run_wall_s": wall,  # set-up and data generation included
        "run_cpu_s": cpu,  # this process, all peers
        "evals": evals,
    }


def floats_per_exchange(model: str, topology: str = "ring:8") -> Dict[str, Any]:
    """Bytes exact gossip and PowerGossip r1 send per peer in two rounds (one P and one Q round),
    counted on the transport, as float32 counts per neighbour, and the closed forms."""
    import topologies

    from gossip_powersgd import LocalCluster
    from gossip_powersgd.training.models import build_model

    def sent(comm: Comm, spec):
        import torch

        from gossip_powersgd.algorithms import make_algorithm

        torch.set_num_threads(1)
        net = build_model(model, (3, 32, 32), 10, seed=0)
        with torch.no_grad():  # the peers' models differ (the byte counts do not depend on it)
            for p in net.parameters():
                p.add_(0.01 * comm.rank)
        algorithm = make_algorithm(spec, net.named_parameters(), comm)
        before = comm.stats.bytes_sent
        for _ in range(2):
            algorithm.step()
        return comm.stats.bytes_sent - before

    graph = topologies.parse(topology)
    degree = 2 if topology.startswith("ring") else None
    measured = {}
    for spec in ("exact", "powergossip:rank=1"):
        per_rank = LocalCluster(graph, timeout=600).run(sent, spec)
        measured[spec] = per_rank[0] / 2 / 4 / degree  # per round, per neighbour, in floats
    net = build_model(model, (3, 32, 32), 10, seed=0)
    matrices = [(p.shape[0], p[0].numel()) for p in net.parameters() if p.ndim >= 2]
    vectors = sum(p.numel() for p in net.parameters() if p.ndim < 2)
    rows, cols = sum(m for m, _ in matrices), sum(n for _, n in matrices)
    parameters = sum(p.numel() for p in net.parameters())
    closed_pg = (rows + cols) / 2 + vectors
    return {
        "model": model,
        "parameters": parameters,
        "exact_floats": measured["exact"],
        "powergossip_r1_floats": measured["powergossip:rank=1"],
        "ratio": measured["exact"] / measured["powergossip:rank=1"],
        "closed_exact": parameters,
        "closed_powergossip_r1": closed_pg,
        "closed_ratio": parameters / closed_pg,
        "closed_text": f"{parameters:,} / (({rows:,} + {cols:,}) / 2 + {vectors:,})",
    }


def step_seconds(model: str, batch: int, reps: int) -> Dict[str, float]:
    """One forward + backward + SGD step of `model` at `batch` on one thread (median of `reps`
    after a warm-up), thread CPU time and wall time."""
    import torch
    import torch.nn.functional as F

    from gossip_powersgd.training.models import build_model

    torch.set_num_threads(1)
    net = build_model(model, (3, 32, 32), 10, seed=0)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)
    walls, cpus = [], []
    for i in range(reps + 1):
        wall, cpu = time.perf_counter(), time.thread_time()
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
        if i:  # the first is a warm-up
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
    return {"batch": batch, "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/paper-standin, or runs/paper-standin-quick with "
        "--quick; the committed page: --out experiments/results)",
    )
    parser.add_argument(
        "--rows",
        default=None,
        help="semicolon-separated row labels to run (default: all; for partial checks and "
        "other seeds)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the runs' seed (data, models, batches; default 0, the committed page's)",
    )
    parser.add_argument(
        "--extra",
        type=Path,
        action="append",
        default=[],
        metavar="JSON",
        help="with --render-only: another run's paper_standin.json (e.g. another --seed) whose "
        "rows the page lists next to the main run's",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="train this many epochs instead of the setting's (pilots; the page says so)",
    )
    parser.add_argument(
        "--render-only",
        type=Path,
        default=None,
        metavar="JSON",
        help="rewrite the page next to this paper_standin.json from it, without training",
    )
    args = parser.parse_args(argv)
    if args.render_only is not None:
        return render_only(args.render_only, args.extra)
    if args.extra:
        raise SystemExit("--extra goes with --render-only (it adds another run's rows to a page)")
    import torch

    from experiments.paper_standin_page import render, plot
    from experiments.suite.tables import generated_sentence

    torch.set_num_threads(1)
    setting = dict(SETTINGS[args.quick], seed=args.seed)
    if args.epochs is not None:
        if args.epochs < 1:
            raise SystemExit(f"--epochs must be >= 1, got {args.epochs}")
        setting.update(epochs=args.epochs, eval_every=min(setting["eval_every"], args.epochs))
    out_dir = args.out or DEFAULT_OUT.with_name(
        "paper-standin-quick" if args.quick else "paper-standin"
    )
    wanted = None if args.rows is None else {s.strip() for s in args.rows.split(";")}
    rows_todo = [r for r in ROWS if wanted is None or r[0] in wanted]
    if wanted is not None and len(rows_todo) != len(wanted):
        known = "; ".join(r[0] for r in ROWS)
        raise SystemExit(f"--rows: unknown label in {args.rows!r} (valid: {known})")
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    traffic = [floats_per_exchange(setting["model"], setting["topology"])]
    for name in setting["traffic_models"]:
        traffic.append(floats_per_exchange(name, setting["topology"]))
    for t in traffic:
        log(f"{t['model']}: {t['ratio']:.2f}x fewer floats (closed form {t['closed_ratio']:.2f}x)")
    timing = step_seconds(setting["model"], PAPER_BATCH, 2 if args.quick else 5)
    log(f"one {setting['model']} step at batch {PAPER_BATCH}: {timing['cpu_s']:.3f} s CPU")
    command = (
        COMMAND
        + (" --quick" if args.quick else "")
        + (f" --epochs {args.epochs}" if args.epochs is not None else "")
        + (f" --seed {args.seed}" if args.seed else "")
        + (f" --rows {args.rows!r}" if args.rows else "")
        + (f" --out {args.out}" if args.out else "")
    )
    projection = {
        "epochs": PAPER_EPOCHS,
        "steps_per_epoch": math.ceil(CIFAR_TRAIN / (PAPER_PEERS * PAPER_BATCH)),
    }
    projection["steps"] = projection["epochs"] * projection["steps_per_epoch"]
    rows: List[Dict[str, Any]] = []
    failed: List[Dict[str, str]] = []
    result = {
        "command": command,
        "setting": setting,
        "traffic": traffic,
        "timing_batch128": timing,
        "projection": projection,
        "load": [load_start, None],
        "cpu_count": os.cpu_count(),
        "seconds": None,
        "rows": rows,
        "failed": failed,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    for label, spec, local_steps in rows_todo:
        log(f"{label}: {spec}, local_steps {local_steps}")
        try:
            row = train_row(setting, label, spec, local_steps)
        except Exception as exc:  # a row that fails (diverges) is reported, not fatal
            from gossip_powersgd.launch import error_line

            failed.append({"label": label, "algorithm": spec, "error": error_line(exc)})
            log(f"  failed: {failed[-1]['error']}")
            continue
        log(
            f"  {row['steps']} steps in {row['run_wall_s']:.0f} s: averaged model "
            f"{100 * row['acc_avg']:.1f} %, {row['mb_per_peer']:.2f} MB per peer"
        )
        rows.append(row)
        # the rows so far, in case a later one stops the run (the page is written at the end)
        atomic_write(out_dir / "paper_standin.json", (json.dumps(result, indent=2) + "\n").encode())
    if not rows:
        raise SystemExit("every row failed: " + "; ".join(f["error"] for f in failed))
    seconds = time.perf_counter() - started
    result.update(seconds=seconds, load=[load_start, os.getloadavg()[0]])
    atomic_write(out_dir / "paper_standin.csv", curves_csv(rows).encode())
    result["generated"] = generated_sentence(command, seconds)
    atomic_write(out_dir / "paper_standin.json", (json.dumps(result, indent=2) + "\n").encode())
    plotted = plot(rows, out_dir / "paper_standin.png")
    page = render(result, result["generated"], plotted)
    atomic_write(out_dir / "paper_standin.md", page.encode())
    log(f"wrote {out_dir / 'paper_standin.md'} in {seconds:.0f} s")


def _load_result(path: Path) -> Dict[str, Any]:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--render-only {path}: cannot read the run's JSON ({exc})") from None
    if "generated" not in result or "rows" not in result:
        raise SystemExit(f"{path}: not a finished paper_standin.json (no rows / generated)")
    return result


def render_only(path: Path, extra: List[Path] = ()) -> None:
    """The page (and plot) again from a run's JSON, naming both the run's commit and this one;
    `extra`: other runs' JSON (other seeds) whose rows the page lists too."""
    from experiments.engine.provenance import page_commit
    from experiments.paper_standin_page import plot, render

    result = _load_result(path)
    others = [dict(_load_result(p), path=str(p)) for p in extra]
    plotted = plot(result["rows"], path.with_name("paper_standin.png"))
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    options = "".join(f" --extra {p}" for p in extra)
    rendered = (
        f" Page re-rendered from its JSON by `{COMMAND} --render-only {path}{options}` on {date} "
        f"(commit {page_commit()}); the figures are the run's."
    )
    page = render(result, result["generated"], plotted, rendered, others)
    atomic_write(path.with_name("paper_standin.md"), page.encode())
    log(f"wrote {path.with_name('paper_standin.md')}")


def curves_csv(rows: List[Dict[str, Any]]) -> str:
    """Every evaluation of every row (the curves the page's tables and plot are made of)."""
    keys = ["epoch", "step", "mb", "acc_avg", "acc_local_mean", "acc_local_min"]
    keys += ["consensus_distance", "train_loss"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["row", "algorithm", "local_steps", *keys])
    for row in rows:
        for e in row["evals"]:
            writer.writerow(
                [row["label"], row["algorithm"], row["local_steps"]] + [e[k] for k in keys]
            )
    return buffer.getvalue()


if __name__ == "__main__":
    from gossip_powersgd.launch import main_guard

    main_guard(main)
