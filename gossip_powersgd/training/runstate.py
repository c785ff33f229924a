"""`RunState`: everything about a run that changes as it trains, and what a checkpoint holds."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import checkpoint as ckpt
from .hooks import HookList

if TYPE_CHECKING:
    from ..comm.base import Comm

__all__ = ["RunState"]


@dataclasses.dataclass
class RunState:
    """Everything about a run that changes as it trains, besides the objects that train.

    `to_checkpoint` / `from_checkpoint` are the one place that says what a checkpoint holds, so
    saving and resuming cannot drift apart. Timers: `time_compute` is this peer's forward, backward
    and optimizer time; the gossip timers are the algorithm's own counters on top of the `base_*`
    values a resumed run starts from.
    """

    step: int = 0
    epoch: int = 0
    history: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    loss_sum: float = 0.0  # training loss since the last evaluation
    loss_count: int = 0
    log_sum: float = 0.0  # training loss since the last log record
    log_count: int = 0
    time_compute: float = 0.0
    base_gossip_compute: float = 0.0
    base_communication: float = 0.0
    base_wall: float = 0.0
    wall_start: float = dataclasses.field(default_factory=time.perf_counter)  # this process's

    def finish_step(self, loss: Optional[float]) -> None:
        """Count a completed step and its training loss (None: an empty batch, no loss)."""
        self.step += 1
        if loss is None:
            return
        self.loss_sum += loss
        self.loss_count += 1
        self.log_sum += loss
        self.log_count += 1

    def take_train_loss(self) -> Optional[float]:
        """This peer's mean training loss since the last evaluation (None: no step of the window
        had a loss, every batch was empty); starts the next window."""
        mean = self.loss_sum / self.loss_count if self.loss_count else None
        self.loss_sum, self.loss_count = 0.0, 0
        return mean

    def take_log_loss(self) -> Optional[float]:
        """This peer's mean training loss since the last log record (None: no step had a loss);
        starts the next window."""
        mean = self.log_sum / self.log_count if self.log_count else None
        self.log_sum, self.log_count = 0.0, 0
        return mean

    def timers(self, algorithm) -> Dict[str, float]:
        """The run's timers so far (seconds), as the records spell them (`TIMING_KEYS`)."""
        return {
            "time_compute": self.time_compute,
            "time_gossip_compute": self.base_gossip_compute + algorithm.time_compute,
            "time_communication": self.base_communication + algorithm.time_communication,
            "wall_time": self.base_wall + time.perf_counter() - self.wall_start,
        }

    def to_checkpoint(
        self,
        *,
        model,
        optimizer,
        algorithm,
        batches,
        comm: Comm,
        hooks: HookList,
        include_rng: bool,
    ) -> Dict[str, Any]:
        """The checkpoint payload: this state, the training objects' states and the RNGs (the
        global ones only when `include_rng`, i.e. the process is this peer's own)."""
        t = self.timers(algorithm)
        return {
            "epoch": self.epoch,
            "step": self.step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "algorithm": algorithm.state_dict(),
            "batches": batches.state_dict(),
            "rng": ckpt.rng_state(include_rng),
            "history": json.dumps(self.history),
            "loss_sum": self.loss_sum,
            "loss_count": self.loss_count,
            "log_sum": self.log_sum,
            "log_count": self.log_count,
            "stats": comm.stats.as_dict(),
            "times": {
                "compute": t["time_compute"],
                "gossip_compute": t["time_gossip_compute"],
                "communication": t["time_communication"],
                "wall": t["wall_time"],
            },
            "hooks": hooks.state_dict(),
        }

    @classmethod
    def from_checkpoint(
        cls,
        state: Dict[str, Any],
        *,
        model,
        optimizer,
        algorithm,
        batches,
        comm: Comm,
        hooks: HookList,
        restore_rng: bool,
    ) -> "RunState":
        """Load a `to_checkpoint` payload back into the training objects, the communicator's
        traffic counters and the RNGs; return the run's state at the checkpoint."""
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        algorithm.load_state_dict(state["algorithm"])
        batches.load_state_dict(state["batches"])
        hooks.load_state_dict(state.get("hooks", {}))  # checkpoints from before hooks hold none
        if restore_rng:
            ckpt.set_rng_state(state["rng"])
        # Every counter (the projected times come from rounds and critical_bytes): a counter
        # missing from a checkpoint is refused, not silently restarted from zero.
        saved = state["stats"]
        for field in dataclasses.fields(comm.stats):
            if field.name not in saved:
                raise ValueError(
                    f"the checkpoint's traffic counters lack {field.name!r} (written "
                    "by an older version?); start the run again"
                )
            setattr(comm.stats, field.name, int(saved[field.name]))
        times = state["times"]
        return cls(
            step=int(state["step"]),
            epoch=int(state["epoch"]),
            history=json.loads(state["history"]),
            loss_sum=float(state["loss_sum"]),
            loss_count=int(state["loss_count"]),
            log_sum=float(state["log_sum"]),
            log_count=int(state["log_count"]),
            time_compute=float(times["compute"]),
            base_gossip_compute=float(times["gossip_compute"]),
            base_communication=float(times["communication"]),
            base_wall=float(times["wall"]),
        )
