"""Decentralized training: `train(comm, config)` runs on every peer, with either transport.

Each step follows the D-PSGD order, on every peer at once::

    1. forward and backward on this peer's own mini-batch       (model.zero_grad, loss.backward)
    2. gradient averagers only (`algo.acts_on == "gradients"`, e.g. PowerSGD all-reduce):
       algo.step() averages p.grad in place
    3. optimizer.step()                                          (local SGD / Adam / AdamW update)
       (with `max_grad_norm`, the gradient is first clipped to that global norm)
    4. parameter gossip (`acts_on == "parameters"`, the default: exact gossip, PowerGossip, ...):
       algo.step() mixes the parameters with the neighbours'

so with parameter gossip each peer takes a local step and then averages with its neighbours, as in
Lian et al. (2017) and the PowerGossip paper; with `local_steps: H` step 4 runs after every H-th
step only (local SGD between communication rounds). The learning rate is set before every step from the
schedule (linear warm-up, then constant / step / cosine). `hooks` (see `hooks.TrainingHooks`) run
at named points of the step, at evaluation and at checkpoints.

Set-up (the checked config, data, model, algorithm, optimizer, set-up hooks) is in `setup.py`.
Every peer loads the same dataset from the same seed and keeps only its own shard (`peer_shard`);
data never crosses the transport. Models are built from the same seed on all peers (identical
initial weights); the batch order differs per peer (`Batches` is seeded with the rank). An epoch is
the same number of steps on every peer, ceil(training samples / (peers x batch size)), so that peers
with unequal shards (Dirichlet partitions) still gossip in lockstep.

Every `eval_every` epochs (and at the end) the peers evaluate, with metric all-reduces that are
never charged to the algorithm (`evaluation.py`: each peer's local test accuracy/loss with the
mean, min and max over peers, the averaged model, the consensus distance, the training loss).
BatchNorm statistics are not gossiped: each local model is evaluated with its own, and the averaged
model's are recomputed on a few of each peer's batches (`batchnorm.py`).
Records go to `RUN_DIR/metrics/rank-K.jsonl`; checkpoints and the run directory are in
`checkpoint.py`, what a checkpoint holds is `RunState`; rank 0 writes `summary.json` and
`summary.md`, and every peer its own figures (shard size, label histogram, training loss, its ε
under DP) to `RUN_DIR/peers/rank-K.json`. Under DP and `partition: local` those figures go nowhere
else unless `release_peer_statistics: true` (`privacy.training.keeps_peer_statistics_private`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    Optional,
    Sequence,
    Union,
)

import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_

from ..algorithms.base import NonFiniteError
from . import checkpoint as ckpt
from . import rundir
from .rundir import AUTO
from .config import TrainConfig
from .evaluation import (
    TIMING_KEYS,
    flat_logits,
    average_state_into,
    evaluate_model,
    model_digest,
)
from .features import feature_hooks
from .hooks import HookList, TrainingHooks
from .progress import SetupLog
from .provenance import provenance
from .report import format_summary
from .resume import auto_resumes
from .runstate import RunState
from .churn_run import churn_run
from .divergence import DIVERGENCE_FACTOR, check_divergence
from .session import open_session
from .setup import build_run, checked_config, collectively, make_optimizer, resolve_device
from .validation import warmup_steps

if TYPE_CHECKING:
    from ..comm.base import Comm


# ---- small helpers ---------------------------------------------------------------------------------


def learning_rate(config: TrainConfig, step: int, steps_per_epoch: int) -> float:
    """The learning rate of step `step` (0-based): linear warm-up, then the schedule."""
    warmup = warmup_steps(config.warmup_epochs, steps_per_epoch)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    epoch = step / steps_per_epoch
    if config.schedule == "step":
        passed = sum(1 for m in config.milestones if epoch >= m)
        return config.lr * config.decay**passed
    if config.schedule == "cosine":
        total = config.epochs * steps_per_epoch - warmup
        progress = (step - warmup) / max(1, total)
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return config.lr


def gossips_after(step: int, local_steps: int) -> bool:
    """Whether the algorithm communicates after optimizer step `step` (0-based): after steps
    H-1, 2H-1, ... for `local_steps` H. A pure function of the step, so a run resumed from a
    checkpoint in the middle of a period gossips where the uninterrupted one would."""
    return (step + 1) % local_steps == 0


def _endless(batches) -> Iterator:
    """`batches` without end: when this peer's pass over its shard is over, start the next one."""
    while True:
        yield from batches


def _check_loss(value: Optional[float], rank: int, step: int, hint: str) -> None:
    """Stop on a training loss that is not finite (None: an empty batch had none)."""
    if value is not None and not math.isfinite(value):
        raise NonFiniteError(
            f"rank {rank}: the training loss is {value} at step "
            f"{step} (lower the learning rate or check the "
            f"data){hint}"
        )


# ---- training ------------------------------------------------------------------------------------


def train(
    comm: Comm,
    config,
    *,
    resume: Union[bool, str] = False,
    on_step: Optional[Callable[[int], None]] = None,
    hooks: Iterable[TrainingHooks] = (),
) -> Dict[str, Any]:
    """Train on this peer; call it on every peer (it is collective). Returns the run's summary.

    Args:
        comm: this peer's communicator (`MPICommunicator`, or the one `LocalCluster.run` passes).
        config: a `TrainConfig` (or a dict of its keys). With `out_dir` set, the run directory is
            written as described in the module docstring; with `out_dir=None` nothing is written.
        resume: continue the run in `config.out_dir` from the newest checkpoint all ranks hold;
            "auto": continue it if every rank has a checkpoint of some epoch there, else start it
            (what a relaunch by `torchrun --max-restarts` or a batch scheduler's requeue wants;
            the files of an attempt that ended before its first complete checkpoint, one that
            some ranks had not written, are moved to `RUN_DIR/failed-attempts/K/`, never deleted).
        on_step: called as `on_step(step)` after every completed step (tests use it to interrupt).
        hooks: `TrainingHooks` run at the loop's extension points, in order (see `hooks.py`); a
            resumed run needs the hooks it was started with (their state is checkpointed).

    The returned dict (same on every peer except `rank`, `history`, this peer's records, and
    `peer`, its own figures as in `peers/rank-K.json`) is what `summary.json` holds, plus these.
    """
    rundir.check_resume(resume)
    auto = resume == AUTO
    log = SetupLog(comm.rank, quiet=False)
    config = checked_config(comm, config, bool(resume))
    log.enabled = log.enabled and not config.quiet
    log.done(f"config checked: {comm.size} peers agree on it")
    if auto:
        mine = collectively(comm, ckpt.available_epochs, config.out_dir, comm.rank)
        resume = auto_resumes(comm, config.out_dir, mine)  # an epoch every rank holds
    added = feature_hooks(config)  # what the config turns on: DP, observers, loggers (features.py)
    churn = churn_run(comm, config)  # on_peer_loss: continue: peers may leave and join
    if churn is not None:
        comm = churn.comm  # the transport over the members of the moment
        added.append(churn)
    hooks = HookList([*hooks, *added])
    run_dir = Path(config.out_dir) if config.out_dir is not None else None
    lock = None
    if run_dir is not None:
        lock = collectively(comm, rundir.claim_on_rank_0, comm.rank, run_dir, resume)
    try:
        if run_dir is not None:
            if auto and not resume:  # collective: every rank waits for rank 0 to move them
                collectively(comm, rundir.set_aside_on_rank_0, comm.rank, run_dir)
            if churn is None or not churn.rejoining:  # (a rejoining peer's run dir exists)
                collectively(comm, ckpt.check_run_dir, run_dir, resume)
        return _train(
            comm,
            config,
            run_dir,
            resume=resume,
            on_step=on_step,
            hooks=hooks,
            reporting=added,
            log=log,
            churn=churn,
        )
    finally:
        if lock is not None:
            lock.release()


def _train(
    comm: Comm,
    config: TrainConfig,
    run_dir: Optional[Path],
    *,
    resume: bool,
    log: SetupLog,
    on_step: Optional[Callable[[int], None]],
    hooks: HookList,
    reporting: Sequence[TrainingHooks],
    churn=None,
) -> Dict[str, Any]:
    """`train` once the run directory is held: build, resume, run the loop, write the summary
    (which each hook in `reporting`, the features' hooks, extends with its `summary_fields()`,
    and its own `peers/rank-K.json` with `peer_fields()`, where it has them). The loop is here;
    the work around it (resuming, records, evaluations, checkpoints, teardown) in `session.py`."""
    origin = provenance(comm, config)  # collective over every peer: before anyone may be away
    run = build_run(comm, config, hooks, log, resume=bool(resume), origin=origin)
    session = open_session(comm, config, run_dir, run, hooks, reporting, churn, origin, resume, log)
    state, model, optimizer, algorithm = session.state, run.model, run.optimizer, run.algorithm
    batches = _endless(run.batches)
    lr = None  # set by every step this peer trains (a member at an epoch's end has trained one)
    try:
        while state.epoch < config.epochs:
            for _ in range(run.steps_per_epoch):
                if churn is not None and not churn.begin_step(state):
                    state.step += 1  # away: the step passes without this peer
                    continue
                lr = learning_rate(config, state.step, run.steps_per_epoch)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                xb, yb = next(batches)
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                value = None  # an empty Poisson batch (DP) has no loss: no forward, no backward,
                if len(yb):  # the privacy hook's after_backward makes its (pure noise) gradient
                    loss = F.cross_entropy(*flat_logits(model(xb), yb))
                    hooks.before_backward(state.step, loss).backward()
                    value = float(loss.detach())
                state.time_compute += time.perf_counter() - start
                _check_loss(value, comm.rank, state.step, session.hint)
                hooks.after_backward(state.step)
                if run.acts_on == "gradients":
                    algorithm.step()
                    hooks.after_gossip(state.step)
                start = time.perf_counter()
                if config.max_grad_norm is not None:  # after any averaging: what the step uses
                    clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                state.time_compute += time.perf_counter() - start
                hooks.after_optimizer_step(state.step)
                if run.acts_on == "parameters" and gossips_after(state.step, config.local_steps):
                    algorithm.step()
                    hooks.after_gossip(state.step)
                state.finish_step(value)
                hooks.after_step(state.step - 1, value)
                session.printer.update()
                if config.log_every and state.step % config.log_every == 0:
                    session.log(lr)
                if on_step is not None:
                    on_step(state.step)
            state.epoch += 1
            session.end_epoch(lr)  # the evaluation and the checkpoint that are due
        # on_peer_loss: continue on torch: a loss found at the very end takes effect now, and the
        # members evaluate again without it (the end's record is theirs: `ChurnRun.settle`)
        if churn is not None and churn.settle(state) and churn.live:
            lr_end = learning_rate(config, state.step - 1, run.steps_per_epoch)
            session.evaluate(lr_end, session.train_loss)
    finally:
        session.close()
    return session.finish(reporting, origin)


__all__ = [
    "train",
    "format_summary",
    "learning_rate",
    "make_optimizer",
    "model_digest",
    "evaluate_model",
    "average_state_into",
    "collectively",
    "resolve_device",
    "RunState",
    "TIMING_KEYS",
    "DIVERGENCE_FACTOR",
    "check_divergence",
]
