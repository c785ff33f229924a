"""Decentralized training: `train(comm, config)` runs on every peer, with either transport.

Each step follows the D-PSGD order, on every peer at once::

    1. forward and backward on this peer's own mini-batch       (model.zero_grad, loss.backward)
    2. gradient averagers only (`algo.acts_on == "gradients"`, e.g. PowerSGD all-reduce):
       algo.step() averages p.grad in place
    3. optimizer.step()                                          (local SGD / Adam / AdamW update)
    4. parameter gossip (`acts_on == "parameters"`, the default: exact gossip, PowerGossip, ...):
       algo.step() mixes the parameters with the neighbours'

so with parameter gossip each peer takes a local step and then averages with its neighbours, as in
Lian et al. (2017) and the PowerGossip paper. The learning rate is set before every step from the
schedule (linear warm-up, then constant / step / cosine).

Every peer loads the same dataset from the same seed and keeps only its own shard (`peer_shard`);
data never crosses the transport. Models are built from the same seed on all peers (identical
initial weights); the batch order differs per peer (`Batches` is seeded with the rank). An epoch is
the same number of steps on every peer, ceil(training samples / (peers x batch size)), so that peers
with unequal shards (Dirichlet partitions) still gossip in lockstep.

Every `eval_every` epochs (and at the end) the peers evaluate, with metric all-reduces that are
never charged to the algorithm: each peer's local test accuracy/loss (mean, min, max over peers),
the averaged model (parameters and buffers averaged, evaluated on a copy), the consensus distance
and the training loss. Records go to `RUN_DIR/metrics/rank-K.jsonl`; checkpoints are in
`checkpoint.py`; rank 0 writes `summary.json` and `summary.md`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..algorithms import make_algorithm
from ..algorithms.base import NonFiniteError
from ..comm.base import CommunicationError
from ..metrics import consensus_distance
from . import checkpoint as ckpt
from .config import (
    TrainConfig,
    agreement_text,
    config_from_dict,
    config_hash,
    dump_config,
    hashed_config,
    resolve_topology,
    validate_config,
)

#: Bytes of an error message shared with every peer (see `collectively`).
_MESSAGE_BYTES = 1024
#: Record keys that depend on timing, not on the computation (left out when comparing runs).
TIMING_KEYS = ("time_compute", "time_gossip_compute", "time_communication", "wall_time")


# ---- small helpers ---------------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, KeyError):
        text = text.strip("'\"")
    return text.splitlines()[0] if text else type(exc).__name__


def collectively(comm, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """Run `fn` on every peer; if it failed on any, raise the same ValueError on every peer.

    The message is the first failing rank's (in rank order), so every rank, under either transport,
    reports the same one line. Used for checks whose outcome may differ between ranks (files on disk).
    """
    error: Optional[BaseException] = None
    result = None
    try:
        result = fn(*args, **kwargs)
    except CommunicationError:
        raise
    except (ValueError, KeyError, OSError, RuntimeError, TypeError) as exc:
        error = exc
    text = "" if error is None else _one_line(error) or type(error).__name__
    data = text.encode("utf-8")[:_MESSAGE_BYTES].ljust(_MESSAGE_BYTES, b"\0")
    gathered = comm.allgather_bytes(data)
    for message in gathered:
        message = message.rstrip(b"\0")
        if message:
            raise ValueError(message.decode("utf-8", errors="replace"))
    return result


def resolve_device(spec: str, rank: int) -> torch.device:
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available (use device: cpu)")
    if spec == "cuda":
        return torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    return torch.device(spec)


def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay, nesterov=config.nesterov)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    raise ValueError(f"unknown optimizer {config.optimizer!r}; valid: sgd, adam, adamw")


def learning_rate(config: TrainConfig, step: int, steps_per_epoch: int) -> float:
    """The learning rate of step `step` (0-based): linear warm-up, then the schedule."""
    warmup_steps = int(round(config.warmup_epochs * steps_per_epoch))
    if step < warmup_steps:
        return config.lr * (step + 1) / warmup_steps
    epoch = step / steps_per_epoch
    if config.schedule == "step":
        passed = sum(1 for m in config.milestones if epoch >= m)
        return config.lr * config.decay ** passed
    if config.schedule == "cosine":
        total = config.epochs * steps_per_epoch - warmup_steps
        progress = (step - warmup_steps) / max(1, total)
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return config.lr


def model_digest(model: torch.nn.Module) -> str:
    """sha256 of the model's state (parameters and buffers, in order): equal iff bit-identical."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tensor.dtype).encode())
        h.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def evaluate_model(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024):
    """(accuracy, mean cross-entropy) of `model` on (x, y), in eval mode, without gradients."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(y), batch):
            out = model(x[start:start + batch])
            target = y[start:start + batch]
            loss_sum += float(F.cross_entropy(out, target, reduction="sum"))
            correct += int((out.argmax(dim=1) == target).sum())
    model.train(was_training)
    return correct / max(1, len(y)), loss_sum / max(1, len(y))


def average_state_into(model: torch.nn.Module, target: torch.nn.Module, comm) -> None:
    """`target` <- the peers' average of `model` (floating parameters and buffers; metric traffic).

    Integer buffers (e.g. BatchNorm's num_batches_tracked) are copied from this peer.
    """
    state = model.state_dict()
    floating = [k for k, v in state.items() if v.is_floating_point()]
    if floating:
        flat = torch.cat([state[k].detach().reshape(-1).to(torch.float64) for k in floating])
        comm.allreduce_(flat, op="mean", metric=True)
    new_state, offset = {}, 0
    for key, value in state.items():
        if key in floating:
            n = value.numel()
            new_state[key] = flat[offset:offset + n].view(value.shape).to(value.dtype)
            offset += n
        else:
            new_state[key] = value
    target.load_state_dict(new_state)


def _process_owned(comm) -> bool:
    """Whether this peer has the process to itself (MPI), so that the global RNGs are its own."""
    from ..comm.local import LocalCommunicator

    return not isinstance(comm, LocalCommunicator)


def _mean_degree(topology) -> float:
    return sum(len(topology.neighbors(i)) for i in range(topology.size)) / topology.size


# ---- the run directory -----------------------------------------------------------------------------

def _check_run_dir(run_dir: Path, resume: bool) -> None:
    if resume:
        if not run_dir.is_dir():
            raise ValueError(f"cannot resume {run_dir}: no such run directory")
        return
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ValueError(f"run directory {run_dir} already exists; choose another out_dir "
                         f"(--set out_dir=...) or continue it with --resume {run_dir}")


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the records up to `last_step` (what the checkpoint holds); drop the rest."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            break  # a half-written last line
        if record.get("step", 0) > last_step:
            break
        kept.append(line)
    ckpt.atomic_write_text(path, "".join(k + "\n" for k in kept))


# ---- training ------------------------------------------------------------------------------------

class _Printer:
    """Rank 0's progress bar and evaluation lines (nothing on other ranks or when quiet)."""

    def __init__(self, rank: int, config: TrainConfig, total: int, initial: int):
        self.enabled = rank == 0 and not config.quiet
        self.bar = None
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                            desc=f"{config.algorithm} on {config.topology}", file=sys.stderr)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(comm, config, *, resume: bool = False,
          on_step: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
    """Train on this peer; call it on every peer (it is collective). Returns the run's summary.

    Args:
        comm: this peer's communicator (`MPICommunicator`, or the one `LocalCluster.run` passes).
        config: a `TrainConfig` (or a dict of its keys). With `out_dir` set, the run directory is
            written as described in the module docstring; with `out_dir=None` nothing is written.
        resume: continue the run in `config.out_dir` from the newest checkpoint all ranks hold.
        on_step: called as `on_step(step)` after every completed step (tests use it to interrupt).

    The returned dict (same on every peer except `rank` and `history`, this peer's records) is what
    `summary.json` holds, plus `history`.
    """
    if isinstance(config, dict):
        config = config_from_dict(config)
    validate_config(config, deep=False)
    rank, size = comm.rank, comm.size
    topology = comm.topology
    wanted = resolve_topology(config, world_size=size)
    if wanted.size != size or wanted.fingerprint != topology.fingerprint:
        raise ValueError(f"config topology {config.topology!r} ({wanted.size} peers) is not the "
                         f"communicator's ({size} peers)")
    comm.check_agreement("config", agreement_text(config))
    if resume and config.out_dir is None:
        raise ValueError("resume needs a run directory: set out_dir")

    run_dir = Path(config.out_dir) if config.out_dir is not None else None
    if run_dir is not None:
        collectively(comm, _check_run_dir, run_dir, resume)

    from .data import Batches, label_histogram, load_dataset, peer_shard
    from .models import build_model, count_parameters

    device = resolve_device(config.device, rank)
    owns_process = _process_owned(comm)
    if owns_process:
        seed = int(np.random.SeedSequence([config.seed, rank]).generate_state(1)[0])
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)

    # ---- data, model, algorithm, optimizer ----
    dataset = load_dataset(config.dataset, config.seed)
    x_train, y_train = peer_shard(dataset, rank, size, config.partition, config.seed)
    histogram = label_histogram(y_train, dataset.num_classes)
    x_train, y_train = x_train.to(device), y_train.to(device)
    x_test, y_test = dataset.x_test.to(device), dataset.y_test.to(device)
    batches = Batches(x_train, y_train, config.batch_size, seed=config.seed, rank=rank)
    steps_per_epoch = max(1, -(-dataset.num_train // (size * config.batch_size)))
    total_steps = config.epochs * steps_per_epoch

    model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed).to(device)
    averaged = copy.deepcopy(model)  # evaluated with the peers' average; never trained
    num_parameters = count_parameters(model)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    algorithm = make_algorithm(config.algorithm, model.named_parameters(), comm)
    acts_on = getattr(algorithm, "acts_on", "parameters")
    if acts_on not in ("parameters", "gradients"):
        raise ValueError(f"algorithm {config.algorithm!r} has acts_on={acts_on!r}; "
                         "expected 'parameters' or 'gradients'")
    optimizer = make_optimizer(config, model.parameters())

    # ---- state (everything a checkpoint holds) ----
    step = epoch = 0
    history: List[Dict[str, Any]] = []
    loss_sum, loss_count = 0.0, 0  # since the last evaluation
    log_sum, log_count = 0.0, 0  # since the last log record
    time_compute = 0.0
    base_gossip_compute = base_communication = base_wall = 0.0

    header_args = dict(rank=rank, world_size=size, topology=topology, topology_spec=config.topology,
                       config_hash=config_hash(config),
                       config_json=json.dumps(hashed_config(config), sort_keys=True))

    if resume:
        epoch_to_load = _agree_resume_epoch(comm, run_dir)
        loaded = collectively(comm, ckpt.load_for_resume, run_dir, epoch_to_load, **header_args)
        state = loaded["state"]

        def apply() -> None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            algorithm.load_state_dict(state["algorithm"])
            batches.load_state_dict(state["batches"])

        collectively(comm, apply)
        if owns_process:
            ckpt.set_rng_state(state["rng"])
        step, epoch = int(state["step"]), int(state["epoch"])
        history = json.loads(state["history"])
        loss_sum, loss_count = float(state["loss_sum"]), int(state["loss_count"])
        log_sum, log_count = float(state["log_sum"]), int(state["log_count"])
        times = state["times"]
        time_compute = float(times["compute"])
        base_gossip_compute = float(times["gossip_compute"])
        base_communication = float(times["communication"])
        base_wall = float(times["wall"])
        stats = state["stats"]
        for key in ("bytes_sent", "messages_sent", "metric_bytes_sent", "metric_messages_sent"):
            setattr(comm.stats, key, int(stats[key]))

    metrics_file = None
    if run_dir is not None:
        (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
        metrics_path = run_dir / "metrics" / f"rank-{rank}.jsonl"
        if resume:
            _truncate_jsonl(metrics_path, step)
        if rank == 0:
            ckpt.atomic_write_text(run_dir / "config.yaml", dump_config(config))
        metrics_file = open(metrics_path, "a")

    wall_start = time.perf_counter()

    def timers() -> Dict[str, float]:
        return {"time_compute": time_compute,
                "time_gossip_compute": base_gossip_compute + algorithm.time_compute,
                "time_communication": base_communication + algorithm.time_communication,
                "wall_time": base_wall + time.perf_counter() - wall_start}

    def write(record: Dict[str, Any]) -> None:
        history.append(record)
        if metrics_file is not None:
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()

    def traffic_means() -> torch.Tensor:
        t = torch.tensor([comm.stats.bytes_sent, comm.stats.messages_sent], dtype=torch.float64)
        return comm.allreduce_(t, op="mean", metric=True)

    def log_record(lr: float) -> None:
        nonlocal log_sum, log_count
        loss = torch.tensor([log_sum / max(1, log_count)], dtype=torch.float64)
        comm.allreduce_(loss, op="mean", metric=True)
        traffic = traffic_means()
        write({"kind": "log", "epoch": step / steps_per_epoch, "step": step, "lr": lr,
               "train_loss": float(loss[0]),
               "consensus_distance": consensus_distance(model.parameters(), comm),
               "bytes_sent": comm.stats.bytes_sent, "messages_sent": comm.stats.messages_sent,
               "mb_sent_per_peer": float(traffic[0]) / 1e6, **timers()})
        log_sum, log_count = 0.0, 0

    def eval_record(lr: float) -> Dict[str, Any]:
        nonlocal loss_sum, loss_count
        acc, loss = evaluate_model(model, x_test, y_test)
        train_loss = loss_sum / max(1, loss_count)
        local = torch.tensor([acc, loss], dtype=torch.float64)
        means = comm.allreduce_(torch.tensor([acc, loss, train_loss], dtype=torch.float64),
                                op="mean", metric=True)
        lows = comm.allreduce_(local.clone(), op="min", metric=True)
        highs = comm.allreduce_(local.clone(), op="max", metric=True)
        average_state_into(model, averaged, comm)
        avg_acc, avg_loss = evaluate_model(averaged, x_test, y_test)
        distance = consensus_distance(model.parameters(), comm)
        traffic = traffic_means()
        record = {
            "kind": "eval", "epoch": epoch, "step": step, "lr": lr,
            "train_loss": float(means[2]), "train_loss_local": train_loss,
            "test_acc_avg_model": avg_acc, "test_loss_avg_model": avg_loss,
            "test_acc_mean": float(means[0]), "test_acc_min": float(lows[0]),
            "test_acc_max": float(highs[0]), "test_loss_mean": float(means[1]),
            "test_loss_min": float(lows[1]), "test_loss_max": float(highs[1]),
            "test_acc_local": acc, "test_loss_local": loss, "consensus_distance": distance,
            "bytes_sent": comm.stats.bytes_sent, "messages_sent": comm.stats.messages_sent,
            "mb_sent_per_peer": float(traffic[0]) / 1e6,
            "messages_sent_per_peer": float(traffic[1]),
            "metric_bytes_sent": comm.stats.metric_bytes_sent,
            **timers(), "model_sha256": model_digest(model),
        }
        write(record)
        loss_sum, loss_count = 0.0, 0
        return record

    def save(lr: float) -> None:
        t = timers()
        state = {
            "epoch": epoch, "step": step, "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "algorithm": algorithm.state_dict(),
            "batches": batches.state_dict(), "rng": ckpt.rng_state(owns_process),
            "history": json.dumps(history), "loss_sum": loss_sum, "loss_count": loss_count,
            "log_sum": log_sum, "log_count": log_count, "stats": comm.stats.as_dict(),
            "times": {"compute": t["time_compute"], "gossip_compute": t["time_gossip_compute"],
                      "communication": t["time_communication"], "wall": t["wall_time"]},
        }
        ckpt.save_checkpoint(run_dir, ckpt.make_header(epoch=epoch, step=step, **header_args), state)

    printer = _Printer(rank, config, total_steps, step)
    iterator = iter(batches)

    def next_batch():
        nonlocal iterator
        while True:
            try:
                return next(iterator)
            except StopIteration:  # this peer's pass over its shard is over: start the next one
                iterator = iter(batches)

    lr = learning_rate(config, max(0, step - 1), steps_per_epoch)
    try:
        while epoch < config.epochs:
            for _ in range(steps_per_epoch):
                lr = learning_rate(config, step, steps_per_epoch)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                xb, yb = next_batch()
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                value = float(loss.detach())
                time_compute += time.perf_counter() - start
                if not math.isfinite(value):
                    raise NonFiniteError(f"rank {rank}: the training loss is {value} at step {step} "
                                         "(lower the learning rate or check the data)")
                if acts_on == "gradients":
                    algorithm.step()
                start = time.perf_counter()
                optimizer.step()
                time_compute += time.perf_counter() - start
                if acts_on == "parameters":
                    algorithm.step()
                step += 1
                loss_sum += value
                loss_count += 1
                log_sum += value
                log_count += 1
                printer.update()
                if config.log_every and step % config.log_every == 0:
                    log_record(lr)
                if on_step is not None:
                    on_step(step)
            epoch += 1
            if epoch % config.eval_every == 0 or epoch == config.epochs:
                r = eval_record(lr)
                printer.line(
                    f"epoch {epoch}/{config.epochs}  train loss {r['train_loss']:.4f}  "
                    f"avg-model acc {100 * r['test_acc_avg_model']:.2f}%  local acc "
                    f"{100 * r['test_acc_mean']:.2f}% [{100 * r['test_acc_min']:.2f}, "
                    f"{100 * r['test_acc_max']:.2f}]  consensus {r['consensus_distance']:.3g}  "
                    f"{r['mb_sent_per_peer']:.3g} MB/peer")
            if run_dir is not None and config.checkpoint_every and (
                    epoch % config.checkpoint_every == 0 or epoch == config.epochs):
                save(lr)
    finally:
        printer.close()
        if metrics_file is not None:
            metrics_file.close()

    summary = _summary(comm, config, history, histogram, num_parameters, parameter_bytes, algorithm,
                       model, step, steps_per_epoch, timers())
    if rank == 0 and run_dir is not None:
        ckpt.atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        ckpt.atomic_write_text(run_dir / "summary.md", format_summary(summary, markdown=True))
    summary = dict(summary, rank=rank, history=history)
    return summary


def _agree_resume_epoch(comm, run_dir: Path) -> int:
    """The newest epoch every rank has a checkpoint file for (same answer on every rank)."""
    mine = ckpt.available_epochs(run_dir, comm.rank)[-8:]
    data = np.asarray(mine + [-1] * (8 - len(mine)), dtype=np.int64).tobytes()
    per_rank = [[int(v) for v in np.frombuffer(g, dtype=np.int64) if v >= 0]
                for g in comm.allgather_bytes(data)]
    epoch = ckpt.latest_common_epoch(per_rank)
    if epoch is None:
        holders = [k for k, e in enumerate(per_rank) if e]
        folder = ckpt.checkpoint_dir(run_dir)
        if not holders:
            raise ValueError(f"cannot resume {run_dir}: no checkpoint in {folder}")
        raise ValueError(f"cannot resume {run_dir}: {folder} has checkpoints for rank(s) "
                         f"{_ranks(holders)} but not for every one of the {comm.size} ranks (was it "
                         "written by a run with another number of peers?)")
    return epoch


def _ranks(ranks: List[int]) -> str:
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _summary(comm, config, history, histogram, num_parameters, parameter_bytes, algorithm, model,
             step, steps_per_epoch, timers) -> Dict[str, Any]:
    evals = [r for r in history if r.get("kind") == "eval"]
    final = evals[-1] if evals else {}
    num_classes = len(histogram)
    hist = torch.zeros(comm.size, num_classes, dtype=torch.float64)
    hist[comm.rank] = torch.tensor(histogram, dtype=torch.float64)
    comm.allreduce_(hist, op="sum", metric=True)
    means = comm.allreduce_(torch.tensor(
        [comm.stats.bytes_sent, comm.stats.messages_sent, timers["time_compute"],
         timers["time_gossip_compute"], timers["time_communication"]], dtype=torch.float64),
        op="mean", metric=True)
    wall = torch.tensor([timers["wall_time"]], dtype=torch.float64)
    comm.allreduce_(wall, op="max", metric=True)
    digests = [d.hex() for d in comm.allgather_bytes(bytes.fromhex(model_digest(model)))]
    degree = _mean_degree(comm.topology)
    exact_bytes = parameter_bytes * degree * step
    sent = float(means[0])
    return {
        "algorithm": config.algorithm, "topology": config.topology, "peers": comm.size,
        "dataset": config.dataset, "partition": config.partition, "model": config.model,
        "optimizer": config.optimizer, "epochs": config.epochs, "epochs_done": final.get("epoch", 0),
        "steps": step, "steps_per_epoch": steps_per_epoch, "parameters": num_parameters,
        "final_test_acc_avg_model": final.get("test_acc_avg_model"),
        "final_test_acc_local_mean": final.get("test_acc_mean"),
        "final_test_acc_local_min": final.get("test_acc_min"),
        "final_test_acc_local_max": final.get("test_acc_max"),
        "final_train_loss": final.get("train_loss"),
        "final_consensus_distance": final.get("consensus_distance"),
        "mb_sent_per_peer": sent / 1e6,
        "messages_sent_per_peer": float(means[1]),
        "exact_gossip_mb_per_peer_formula": exact_bytes / 1e6,
        "exact_gossip_formula": (f"model bytes {parameter_bytes} x mean degree {degree:g} x steps "
                                 f"{step} (formula, not measured)"),
        "compression_ratio": (exact_bytes / sent) if sent > 0 else None,
        "bytes_per_step": int(algorithm.bytes_per_step()),
        "wall_time_s": float(wall[0]),
        "time_compute_s": float(means[2]), "time_gossip_compute_s": float(means[3]),
        "time_communication_s": float(means[4]),
        "label_histogram": [[int(v) for v in row] for row in hist.tolist()],
        "model_sha256": digests,
        "run_dir": config.out_dir,
    }


def _fmt(value, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    if pct:
        return f"{100 * value:.2f} %"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_summary(summary: Dict[str, Any], markdown: bool = False) -> str:
    """The summary as a table (markdown for summary.md, aligned text for the terminal)."""
    rows = [
        ("algorithm", summary["algorithm"]),
        ("topology", f"{summary['topology']} ({summary['peers']} peers)"),
        ("data / model", f"{summary['dataset']} ({summary['partition']}) / {summary['model']}, "
                         f"{summary['parameters']} parameters"),
        ("epochs / steps", f"{summary['epochs_done']} / {summary['steps']}"),
        ("averaged-model test accuracy", _fmt(summary["final_test_acc_avg_model"], pct=True)),
        ("local test accuracy mean [min, max]",
         f"{_fmt(summary['final_test_acc_local_mean'], True)} "
         f"[{_fmt(summary['final_test_acc_local_min'], True)}, "
         f"{_fmt(summary['final_test_acc_local_max'], True)}]"),
        ("training loss (mean over peers)", _fmt(summary["final_train_loss"])),
        ("consensus distance", _fmt(summary["final_consensus_distance"])),
        ("training MB sent per peer", f"{summary['mb_sent_per_peer']:.3f}"),
        ("exact gossip MB per peer (formula)",
         f"{summary['exact_gossip_mb_per_peer_formula']:.3f} = {summary['exact_gossip_formula']}"),
        ("exact gossip formula / sent", "n/a" if summary["compression_ratio"] is None
         else f"{summary['compression_ratio']:.1f}x"),
        ("wall time", f"{summary['wall_time_s']:.1f} s (compute {summary['time_compute_s']:.1f} s, "
                      f"gossip compute {summary['time_gossip_compute_s']:.1f} s, communication "
                      f"{summary['time_communication_s']:.1f} s, means over peers)"),
    ]
    hist = summary["label_histogram"]
    if markdown:
        lines = ["# Run summary", "", "| quantity | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in rows]
        lines += ["", "## Label histogram per peer", "",
                  "| peer | " + " | ".join(str(c) for c in range(len(hist[0]))) + " |",
                  "|---" * (len(hist[0]) + 1) + "|"]
        lines += [f"| {k} | " + " | ".join(map(str, row)) + " |" for k, row in enumerate(hist)]
        return "\n".join(lines) + "\n"
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines.append("label histogram per peer (classes 0..{}):".format(len(hist[0]) - 1))
    lines += [f"  peer {k:>3}: {' '.join(f'{v:>4}' for v in row)}" for k, row in enumerate(hist)]
    return "\n".join(lines)


__all__ = ["train", "format_summary", "learning_rate", "make_optimizer", "model_digest",
           "evaluate_model", "average_state_into", "collectively", "TIMING_KEYS"]
