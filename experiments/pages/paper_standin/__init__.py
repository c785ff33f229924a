"""`python -m experiments paper_standin`: the PowerGossip paper's ResNet-20 workload on a
CIFAR-shaped synthetic stand-in (not CIFAR-10), ring:8, the rows of `ROWS` (three again on seeds 1
and 2); per seed also the floats per exchange of PowerGossip r1 against exact gossip on ResNet-20
and VGG-16 (counted on the transport, next to the closed form), and one forward + backward step at
the paper's batch on one thread, from which the page projects a CIFAR-10 run."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._markdown import csv_text
from experiments.pages._figures import png, pyplot
from experiments.suite.runs import EVAL_NAMES, LOCAL

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Communicator

#: The rows: (label, algorithm spec, local_steps). Choco's consensus step is the paper config's
#: (experiments/configs/paper/resnet20_cifar10_choco_sign.yaml); every other γ is the topology's.
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
#: The rows run again on the other seeds.
SEED_ROWS = ("exact gossip", "PowerGossip r1", "PowerGossip r1, 2 iterations")
#: The training recipe of each mode (quick: ring:4, a width-4 ResNet-20, a few records, one seed).
FULL = dict(
    topology="ring:8", dataset="synthetic_images:n=2048,test=500,noise=0.7", model="resnet20"
)
FULL.update(batch_size=16, lr=0.1, momentum=0.9, weight_decay=0.0001, warmup_epochs=1)
# VGG-16 as in the PowerGossip paper (no BatchNorm, conv biases), and with BatchNorm
FULL.update(schedule="cosine", epochs=8, eval_every=2, traffic_models=("vgg16:bn=false", "vgg16"))
QUICK = dict(FULL, topology="ring:4", dataset="synthetic_images:n=96,test=16,noise=1.0")
QUICK.update(model="resnet20:width=4", batch_size=3, warmup_epochs=0, epochs=2, eval_every=1)
SETTINGS: Dict[bool, Dict[str, Any]] = {False: FULL, True: dict(QUICK, traffic_models=())}
#: The paper's CIFAR-10 run, for the projection: 300 epochs of 50,000 images, 8 peers x 128.
PAPER_EPOCHS, CIFAR_TRAIN, PAPER_PEERS, PAPER_BATCH = 300, 50_000, 8, 128

EVAL_KEYS = ("epoch", "step", "mb", "acc_avg", "acc_local_mean", "acc_local_min")
EVAL_KEYS += ("consensus_distance", "train_loss")
#: A row's fields from the run's summary: {field: the summary's name}, and those per step.
SUMMARY = dict(rounds="communication_rounds", parameters="parameters")
SUMMARY.update(acc_avg="final_test_acc_avg_model", acc_local_mean="final_test_acc_local_mean")
SUMMARY.update(consensus_distance="final_consensus_distance", mb_per_peer="mb_sent_per_peer")
SUMMARY.update(exact_mb_formula="exact_gossip_mb_per_peer_formula")
PER_STEP = dict(compute_s_per_step="time_compute_s")
PER_STEP.update(gossip_compute_s_per_step="time_gossip_compute_s", wall_s_per_step="wall_time_s")


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """Per seed (0, then 1 and 2 for SEED_ROWS): the traffic of each model, the step time, the rows."""
    s = SETTINGS[quick]
    recipe = {k: v for k, v in s.items() if k != "traffic_models"}
    runs = []
    for seed in (0,) if quick else (0, 1, 2):
        for model in (s["model"], *s["traffic_models"]):
            traffic = {"kind": "traffic", "model": model, "topology": s["topology"]}
            runs.append(Run(f"seed{seed}/traffic/{model}", traffic, seed))
        timing = {"kind": "timing", "model": s["model"], "reps": 2 if quick else 5}
        runs.append(Run(f"seed{seed}/timing", timing, seed))
        for label, spec, h in ROWS:
            if seed == 0 or label in SEED_ROWS:
                config = dict(kind="train", label=label, spec=spec, local_steps=h, setting=recipe)
                runs.append(Run(f"seed{seed}/{label}", config, seed, cost=10.0))
    return runs


def row(run: Run) -> Dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    c = run.config
    if c["kind"] == "traffic":
        return floats_per_exchange(c["model"], c["topology"])
    if c["kind"] == "timing":
        return step_seconds(c["model"], PAPER_BATCH, c["reps"])
    try:
        return train_row(c["setting"], c["label"], c["spec"], c["local_steps"], run.seed)
    except Exception as exc:  # a row that fails (diverges) is reported, not fatal
        from gossip_powersgd.launch import error_line

        return {"label": c["label"], "algorithm": c["spec"], "error": error_line(exc)}


def train_row(
    setting: Dict[str, Any], label: str, spec: str, local_steps: int, seed: int
) -> Dict[str, Any]:
    """One row: train on every peer and keep its measurements (`load`: the 1-minute load average
    before and after, for the page's header)."""
    from gossip_powersgd import run

    config = dict(setting, algorithm=spec, local_steps=local_steps, optimizer="sgd", seed=seed)
    config.update(LOCAL, comm_timeout=1800.0)
    load = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    result = run(config)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary, steps = result.summary, int(result.summary["steps"])
    evals = [
        {k: r.get(EVAL_NAMES.get(k, k)) for k in EVAL_KEYS}
        for r in result.history
        if r.get("kind") == "eval"
    ]
    out = dict(label=label, algorithm=spec, local_steps=local_steps, steps=steps)
    out.update({key: summary[name] for key, name in SUMMARY.items()})
    # per peer, seconds inside forward/backward/optimizer and inside the gossip's arithmetic; the
    # training loop's wall time (evaluations included); the run's wall (set-up and data generation
    # included) and CPU time (this process, all peers)
    out.update({key: summary[name] / steps for key, name in PER_STEP.items()})
    out.update(run_wall_s=wall, run_cpu_s=cpu, evals=evals)
    return dict(out, load=[load, os.getloadavg()[0]])


def floats_per_exchange(model: str, topology: str) -> Dict[str, Any]:
    """Bytes exact gossip and PowerGossip r1 send per peer in two rounds (one P and one Q round),
    counted on the transport, as float32 counts per neighbour, and the closed forms."""
    import topologies

    from gossip_powersgd import LocalCluster
    from gossip_powersgd.training.models import build_model

    def sent(comm: Communicator, spec):
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

    graph, measured = topologies.parse(topology), {}
    for spec in ("exact", "powergossip:rank=1"):  # per round, per neighbour (a ring's 2), in floats
        measured[spec] = LocalCluster(graph, timeout=600).run(sent, spec)[0] / 2 / 4 / 2
    net = build_model(model, (3, 32, 32), 10, seed=0)
    matrices = [(p.shape[0], p[0].numel()) for p in net.parameters() if p.ndim >= 2]
    vectors = sum(p.numel() for p in net.parameters() if p.ndim < 2)
    rows, cols = sum(m for m, _ in matrices), sum(n for _, n in matrices)
    parameters = sum(p.numel() for p in net.parameters())
    closed_pg = (rows + cols) / 2 + vectors
    exact, pg = measured["exact"], measured["powergossip:rank=1"]
    out = dict(model=model, parameters=parameters, exact_floats=exact, powergossip_r1_floats=pg)
    out.update(ratio=exact / pg, closed_exact=parameters, closed_powergossip_r1=closed_pg)
    text = f"{parameters:,} / (({rows:,} + {cols:,}) / 2 + {vectors:,})"
    return dict(out, closed_ratio=parameters / closed_pg, closed_text=text)


def step_seconds(model: str, batch: int, reps: int) -> Dict[str, float]:
    """One forward + backward + SGD step of `model` at `batch` on one thread (median of `reps`
    after a warm-up), thread CPU time and wall time; and this machine's core count."""
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
    wall_s, cpu_s = statistics.median(walls), statistics.median(cpus)
    return dict(batch=batch, wall_s=wall_s, cpu_s=cpu_s, cpu_count=os.cpu_count())


def result(rows: Rows, seed: int) -> Dict[str, Any]:
    """One seed's run as its JSON holds it; page-level figures of a run converted from the old
    program's JSON (its command, setting, load, seconds and sentence) come from the rows' origin."""
    records = [r for r in rows.records if r.key.startswith(f"seed{seed}/")]
    group = Rows(rows.page, rows.quick, records, len(records))
    old = records[0].origin or {}
    by: Dict[str, List[Any]] = {"traffic": [], "train": []}
    for r in records:
        by.setdefault(r.config["kind"], []).append(r)
    trained = [{k: v for k, v in x.row.items() if k != "load"} for x in by["train"]]
    trained = [x for x in trained if "error" not in x]
    loads = [x.row["load"] for x in by["train"] if "load" in x.row] or [[math.nan, math.nan]]
    timing = dict(by["timing"][0].row) if "timing" in by else {}
    cpu_count = timing.pop("cpu_count", None)
    steps = math.ceil(CIFAR_TRAIN / (PAPER_PEERS * PAPER_BATCH))
    return {
        "command": old.get("command", rows.command),
        "setting": old.get("setting", dict(SETTINGS[rows.quick], seed=seed)),
        "traffic": [x.row for x in by["traffic"]],
        "timing_batch128": timing,
        "projection": dict(epochs=PAPER_EPOCHS, steps_per_epoch=steps, steps=PAPER_EPOCHS * steps),
        "load": old.get("load", [loads[0][0], loads[-1][1]]),
        "cpu_count": old.get("cpu_count", cpu_count),
        "seconds": old.get("seconds", sum(r.seconds for r in records)),
        "rows": trained,
        "failed": [x.row for x in by["train"] if "error" in x.row],
        "generated": old.get("generated", made_by(group)),
        "path": old.get("json", f"paper_standin_seed{seed}.json"),
        "header": made_by(group),
    }


def render(rows: Rows) -> Outputs:
    """paper_standin.md, .csv and .png from seed 0's run, one JSON per seed's run."""
    from .page import page

    seeds = sorted({int(r.key.split("/")[0][4:]) for r in rows.records})
    runs = {seed: result(rows, seed) for seed in seeds}
    main, others = runs[seeds[0]], [runs[s] for s in seeds[1:]]
    if not main["timing_batch128"] or not main["rows"]:  # the page's header needs both
        failed = "".join(f"; {f['label']}: {f['error']}" for f in main["failed"])
        what = "its step time" if not main["timing_batch128"] else "a training row that finished"
        raise ValueError(
            f"paper_standin: seed 0 has no row of {what} yet{failed}: run `{rows.command}`"
        )
    out: Outputs = {"paper_standin.md": page(main, main["header"], others)}
    out["paper_standin.csv"] = curves_csv(main["rows"])
    out["paper_standin.png"] = plot(main["rows"])
    for seed, run in runs.items():
        name = "paper_standin.json" if seed == seeds[0] else f"paper_standin_seed{seed}.json"
        data = {k: v for k, v in run.items() if k not in ("path", "header")}
        out[name] = json.dumps(data, indent=2) + "\n"
    return out


def curves_csv(rows: List[Dict[str, Any]]) -> str:
    """Every evaluation of every row (the curves the page's tables and plot are made of)."""
    lines = (
        [row["label"], row["algorithm"], row["local_steps"], *(e[k] for k in EVAL_KEYS)]
        for row in rows
        for e in row["evals"]
    )
    return csv_text(["row", "algorithm", "local_steps", *EVAL_KEYS], lines)


def plot(rows: List[Dict[str, Any]]) -> bytes:
    """Averaged-model accuracy against epochs and against MB sent (PNG bytes)."""
    plt = pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        xs = [e["epoch"] for e in r["evals"]]
        ys = [100 * e["acc_avg"] for e in r["evals"]]
        a.plot(xs, ys, marker="o", label=r["label"])
        if r["mb_per_peer"] > 0 and r["algorithm"] != "allreduce":
            b.plot([e["mb"] for e in r["evals"]], ys, marker="o", label=r["label"])
    a.set_xlabel("epoch")
    a.set_ylabel("averaged-model test accuracy (%)")
    b.set_xscale("log")
    b.set_xlabel("MB sent per peer")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    return png(fig, dpi=90)


TITLE = "ResNet-20 at the paper's model size on a synthetic CIFAR-shaped stand-in, ring:8"
PAGE = register(Page(name="paper_standin", title=TITLE, plan=plan, row=row, render=render))
