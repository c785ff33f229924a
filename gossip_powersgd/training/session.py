"""The work around `trainer._train`'s loop: everything but the step itself.

`open_session` runs after `setup.build_run`: it resumes from a checkpoint (or places a rejoining
peer), opens the metrics file, writes config.yaml and starts the clocks and the progress line. The
loop then calls the session's `log` (a log record), `end_epoch` (the evaluation and the checkpoint
that are due) and, in its `finally`, `close`; `finish` writes the summary. `TrainSession` holds what
these share.

`eval_record`, `log_record` and `_save` are looked up here at each call
(tests/support/churn_moment.py replaces them to lose a peer at that moment).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

from ..utils import atomic_write
from . import checkpoint as ckpt
from .batchnorm import refresh_inputs
from .churn_run import call
from .config import TrainConfig, dump_config
from .divergence import check_divergence
from .evaluation import RecordLog, eval_line, eval_record, log_record
from .features import peer_statistics_private
from .hooks import HookList, TrainingHooks
from .progress import Printer, SetupLog
from .provenance import as_comments
from .report import report_and_finish
from .resume import agree_resume_epoch, load_for_resume
from .runstate import RunState
from .setup import PeerRun, collectively

if TYPE_CHECKING:
    from ..comm.base import Comm


@dataclasses.dataclass
class TrainSession:
    """What the loop's surroundings share, for one peer's run (built by `open_session`)."""

    comm: Comm
    config: TrainConfig
    run_dir: Optional[Path]
    run: PeerRun
    hooks: HookList
    churn: Any  # the membership driver (`churn_run.ChurnRun`), or None
    state: RunState
    records: RecordLog
    printer: Printer
    timers: Callable
    hint: str  # what a divergence message adds (differential privacy names its noise)
    private: bool  # the peers' statistics are private (`features.peer_statistics_private`)
    guard: Callable  # `ChurnRun.guard`, or a plain call without churn
    resumable: bool  # every rank holds a checkpoint to resume from
    train_loss: Any = 0.0  # the training loss of the last evaluation's window

    def evaluate(self, lr: float, train_loss) -> None:
        """Evaluate every peer (collective): the record written, the hooks told, the line printed
        and divergence checked; nothing on this peer when a lost peer interrupted it (churn)."""
        run, state = self.run, self.state
        record = self.guard(
            "an evaluation",
            eval_record,
            self.comm,
            run.model,
            run.averaged,
            run.x_test,
            run.y_test,
            epoch=state.epoch,
            step=state.step,
            lr=lr,
            train_loss_local=train_loss,
            timers=self.timers,
            pooled=self.config.partition == "local",
            private=self.private,
            own_test=run.own_test,
            bn_inputs=None
            if self.private
            else functools.partial(refresh_inputs, run.batches, state.step),
        )
        if record is None:  # a lost peer interrupted it (churn): no record on this peer
            return
        record = self.hooks.on_evaluation(record)
        self.records.write(record)
        self.hooks.on_record(record)
        self.printer.line(eval_line(record, self.config.epochs))
        check_divergence(record, state.history, run.num_classes, self.hint)

    def log(self, lr: float) -> None:
        """A log record of the steps since the last one (collective)."""
        state = self.state
        record = self.guard(
            "a log record",
            log_record,
            self.comm,
            self.run.model,
            step=state.step,
            steps_per_epoch=self.run.steps_per_epoch,
            lr=lr,
            train_loss_local=state.take_log_loss(),
            timers=self.timers,
            private=self.private,
        )
        if record is not None:  # None: a lost peer interrupted it (churn)
            self.records.write(record)
            self.hooks.on_record(record)
            check_divergence(record, state.history, self.run.num_classes, self.hint)

    def end_epoch(self, lr: Optional[float]) -> None:
        """After `state.epoch` was counted: the evaluation and the checkpoint that are due, by the
        members only (with churn; `lr`, the last step's, is None only on a peer away all along)."""
        config, state = self.config, self.state
        member = self.churn is None or self.churn.live  # evaluations and checkpoints: the members'
        if member and (state.epoch % config.eval_every == 0 or state.epoch == config.epochs):
            self.train_loss = state.take_train_loss()
            self.evaluate(lr, self.train_loss)
        if (
            member
            and self.run_dir is not None
            and config.checkpoint_every
            and (state.epoch % config.checkpoint_every == 0 or state.epoch == config.epochs)
        ):
            # True: the save succeeded on every rank (it is collective); None: a lost peer
            # interrupted it after this peer's file was written whole (churn)
            saved = self.guard("a checkpoint", self._checkpoint)
            self.resumable = self.resumable or saved is not None

    def _checkpoint(self) -> bool:
        """Write this peer's checkpoint (collective, `_save` below); True once it is written."""
        _save(self.comm, self.run_dir, self.run, self.state, self.hooks, self.resumable)
        return True

    def close(self) -> None:
        """The loop's teardown (from its `finally`): the progress line, the metrics file, the
        hooks; a hook that fails to close must not hide why the run failed."""
        self.printer.close()
        self.records.close()
        failing = sys.exc_info()[0] is not None
        try:
            self.hooks.close()
        except Exception:
            if not failing:
                raise

    def finish(self, reporting: Sequence[TrainingHooks], origin) -> Dict[str, Any]:
        """Write the summary and this peer's own figures; what `train` returns. The trackers end
        their runs with the summary (or as failed, without one)."""
        comm, state = self.comm, self.state
        made = None
        try:
            made = report_and_finish(
                comm,
                self.config,
                self.run_dir,
                self.run,
                state,
                reporting,
                self.churn,
                origin,
                self.private,
            )
        finally:
            self.hooks.on_summary(made[0] if made is not None else None)
        summary, peer = made
        return dict(summary, rank=comm.rank, history=state.history, peer=peer)


def open_session(
    comm: Comm,
    config: TrainConfig,
    run_dir: Optional[Path],
    run: PeerRun,
    hooks: HookList,
    reporting: Sequence[TrainingHooks],
    churn,
    origin,
    resume: bool,
    log: SetupLog,
) -> TrainSession:
    """After `build_run`: the run's state (resumed from the newest checkpoint, or a rejoining
    peer's place), its metrics file and config.yaml; the wall clock starts here (it counts
    training, not set-up or loading)."""
    # what a divergence message adds (differential privacy names its noise); after the set-up
    hint = "".join(h.divergence_hint() for h in reporting if hasattr(h, "divergence_hint"))
    state = RunState()
    if churn is not None:  # the algorithm wrapped so that membership changes rebuild it
        churn.start(run, hooks, run_dir)
        churn.place(state)  # a rejoining peer: at its admission's training epoch
    if resume:
        state = _resume(comm, run_dir, run, hooks, churn)
        log.done(f"resumed from the checkpoint of epoch {state.epoch} (step {state.step})")
    records = RecordLog(state.history)
    if run_dir is not None:
        records.file = ckpt.open_metrics(run_dir, comm.rank, state.step if resume else None)
        if comm.rank == 0:
            atomic_write(run_dir / "config.yaml", as_comments(origin) + dump_config(config))
    state.wall_start = time.perf_counter()  # wall time counts training, not set-up or loading
    return TrainSession(
        comm=comm,
        config=config,
        run_dir=run_dir,
        run=run,
        hooks=hooks,
        churn=churn,
        state=state,
        records=records,
        printer=Printer(comm.rank, config, config.epochs * run.steps_per_epoch, state.step),
        timers=functools.partial(state.timers, run.algorithm),
        hint=hint,
        private=peer_statistics_private(config),
        guard=churn.guard if churn is not None else call,
        resumable=bool(resume),
    )


def _checkpointed(run: PeerRun, comm: Comm, hooks: HookList) -> Dict[str, Any]:
    """What a checkpoint holds the state of, as `RunState.to_checkpoint` and `from_checkpoint`
    take it (the same objects both ways)."""
    return dict(
        model=run.model,
        optimizer=run.optimizer,
        algorithm=run.algorithm,
        batches=run.batches,
        comm=comm,
        hooks=hooks,
    )


def _resume(comm: Comm, run_dir: Path, run: PeerRun, hooks: HookList, churn) -> RunState:
    """Load the newest checkpoint every rank holds into `run`; its `RunState` (collective). With
    a membership driver (`churn`), peers away at that epoch too (`churn_resume`)."""
    restore = functools.partial(
        RunState.from_checkpoint, **_checkpointed(run, comm, hooks), restore_rng=run.owns_process
    )
    if churn is not None:
        from .churn_resume import resume

        return resume(churn, comm, run_dir, run, restore)
    epoch = agree_resume_epoch(comm, run_dir)
    loaded = collectively(comm, load_for_resume, run_dir, epoch, **run.header_args)
    state = collectively(comm, restore, loaded["state"])
    collectively(comm, ckpt.drop_newer, run_dir, comm.rank, epoch)  # an ended attempt's
    return state


def _save(
    comm: Comm, run_dir: Path, run: PeerRun, state: RunState, hooks: HookList, resumable: bool
) -> None:
    """Write this peer's checkpoint; a failure on any peer (a full disk) stops every peer with the
    same line, and the previous checkpoints stay as they were (files are replaced whole).
    `resumable`: every rank already holds a checkpoint of this run (it resumed from one, or a
    save succeeded everywhere), so the line advises --resume; else starting again."""
    header = ckpt.make_header(epoch=state.epoch, step=state.step, **run.header_args)
    payload = state.to_checkpoint(**_checkpointed(run, comm, hooks), include_rng=run.owns_process)

    def write() -> None:
        try:
            ckpt.save_checkpoint(run_dir, header, payload)
        except OSError as exc:
            advice = (
                "the previous checkpoints are intact (free space, then --resume)"
                if resumable
                else "no checkpoint is held by every rank yet, so the run cannot be resumed: "
                f"free space, then start it again (in a new run directory, or after emptying "
                f"{run_dir})"
            )
            raise OSError(
                f"rank {comm.rank}: cannot write the epoch-{state.epoch} checkpoint in "
                f"{ckpt.checkpoint_dir(run_dir)}: {exc.strerror or exc}; {advice}"
            ) from None
        hooks.on_checkpoint()

    collectively(comm, write)


__all__ = ["TrainSession", "open_session"]
