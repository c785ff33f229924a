"""The paper stand-in's measurements: one training row (every peer a thread of this process), the
floats per exchange of exact gossip and PowerGossip r1 on a model (counted on the transport, next
to the closed form), and one forward + backward step at the paper's batch on one thread."""

from __future__ import annotations

import os
import statistics
import time
from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:
    from gossip_powersgd.comm.base import Communicator

#: The training recipe's keys a row takes from the page's setting.
RECIPE = ("topology", "dataset", "model", "batch_size", "lr", "momentum", "weight_decay")
RECIPE += ("warmup_epochs", "schedule", "epochs", "eval_every")
EVAL_KEYS = ("epoch", "step", "mb", "acc_avg", "acc_local_mean", "acc_local_min")
EVAL_KEYS += ("consensus_distance", "train_loss")
#: A row's fields from the run's summary: {field: the summary's name}, and those per step.
SUMMARY = dict(rounds="communication_rounds", parameters="parameters")
SUMMARY.update(acc_avg="final_test_acc_avg_model", acc_local_mean="final_test_acc_local_mean")
SUMMARY.update(consensus_distance="final_consensus_distance", mb_per_peer="mb_sent_per_peer")
SUMMARY.update(exact_mb_formula="exact_gossip_mb_per_peer_formula")
PER_STEP = dict(
    compute_s_per_step="time_compute_s", gossip_compute_s_per_step="time_gossip_compute_s"
)
PER_STEP.update(wall_s_per_step="wall_time_s")


def train_row(
    setting: Dict[str, Any], label: str, spec: str, local_steps: int, seed: int
) -> Dict[str, Any]:
    """One row: train on every peer and keep its measurements (`load`: the 1-minute load average
    before and after, for the page's header)."""
    from gossip_powersgd import run

    config = {k: setting[k] for k in RECIPE}
    config.update(algorithm=spec, local_steps=local_steps, optimizer="sgd", seed=seed)
    config.update(backend="local", quiet=True, log_every=0, checkpoint_every=0, out_dir=None)
    config.update(threads=1, comm_timeout=1800.0)
    load = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    result = run(config)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary, steps = result.summary, int(result.summary["steps"])
    names = dict(
        mb="mb_sent_per_peer", acc_avg="test_acc_avg_model", acc_local_mean="test_acc_mean"
    )
    names.update(acc_local_min="test_acc_min")
    evals = [
        {k: r.get(names.get(k, k)) for k in EVAL_KEYS}
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
