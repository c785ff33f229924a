"""`Tracker`, the base of the experiment trackers of `loggers:` (`trackers.py`): which peer holds
them, when they open, what their checkpointed state is, and how they hand over.

The trackers are held by one peer, the lowest member: rank 0, unless it left (under
``on_peer_loss: continue``). When the holder leaves (planned: it flushes and closes its tracker
first) or is lost, or a lower peer comes back, the new lowest member takes the trackers over at the
change and continues the same tracker run (`Tracker.on_membership`) as a resumed run does (a
leaving holder closes its tracker before its part in the change's collective, which the others
finish only after it: the next holder opens a closed run, never one still open, which W&B, one
active run per process, would hand back to in-process peers): the same TensorBoard log dir (purging the steps after the change), the same MLflow run id, the same
W&B run id (resumed). The records up to the change's step are the old holder's, those after it
the new one's: each record once. The run ids are shared with every peer at set-up (each peer's
checkpoint holds them), and a joining peer is handed them with its state (`Tracker.handed`, raw
bytes): a process restarted with gossip-train --rejoin that becomes the holder continues the same
MLflow and W&B runs. Not covered: a record that a lost holder had not yet passed on when it was
lost.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

from ..extras import installed
from ..utils import one_line
from .evaluation import shareable
from .hooks import SetupContext, TrainingHooks
from .metric_names import record_scalars

if TYPE_CHECKING:
    from ..comm.base import Comm

#: The run directory's files a tracker keeps with its run (W&B files, MLflow artifacts).
RUN_FILES = ("config.yaml", "summary.json", "summary.md")
#: The bytes of a tracker run id that every peer learns (`Tracker._share_run_id`): MLflow's are 32,
#: W&B's 8.
RUN_ID_BYTES = 64


class Tracker(TrainingHooks):
    """Base of the experiment trackers: held by the lowest member (module docstring); subclasses
    open, write, release and finish.

    A tracker is opened at set-up (a resumed run's: when its checkpointed state, the tracker's run
    id, is loaded, still before the first step), so that a tracker that cannot start stops the run
    at once, with one line on every rank, not at its first record mid-run. It ends its run with the
    summary (`on_summary`), or as failed when the run fails (`close` during an exception)."""

    name = ""
    package = ""  #: the module that must import (named in the error when it does not)

    def __init__(self, **options: Any):
        self.options = options
        self.active = False  # this peer holds the trackers (the lowest member) and has not ended
        self.opened = False
        self.continuing = False  # its next open continues the tracker's run (resumed, taken over)
        self.rank, self.holder = 0, 0  # this peer; the member holding the trackers (None: unknown)
        self.holders: List[List[int]] = [[-1, 0]]  # [after step, holder]: who logged which records
        self.run_id: Optional[str] = None  # a resumed run continues the tracker's run
        self.step: Optional[int] = None  # the last record's (checkpointed: TensorBoard's purge)
        self.logged: Dict[str, int] = {}  # per record kind, the last step the run already holds

    @property
    def key(self) -> str:
        return f"logger.{self.name}"

    @classmethod
    def check_installed(cls) -> None:
        """A one-line error when the tracker's package is missing (found without importing it)."""
        if not installed(cls.package):
            raise ValueError(
                f"loggers: {cls.name} needs the {cls.package} package: "
                "pip install 'gossip_powersgd[tracking]' (or drop it from loggers)"
            )

    @classmethod
    def accepted_options(cls) -> List[str]:
        """The options an entry may give: the tracker's own parameters (see each subclass)."""
        raise NotImplementedError

    @classmethod
    def option_mistakes(cls, options: Dict[str, Any]) -> Optional[str]:
        """The entry's options the tracker does not take, each with the nearest one it does, and
        the list of those it does, as one clause; None when every option is one of them."""
        if not options:  # nothing to check: the tracker's library is not imported for it
            return None
        valid = cls.accepted_options()
        wrong = [k for k in options if k not in valid]
        if not wrong:
            return None
        parts = []
        for key in wrong:
            near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            parts.append(f"no option {key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        return f"{cls.name} has " + ", ".join(parts) + f"; its options: {', '.join(valid)}"

    def setup(self, context: SetupContext) -> None:
        from ..comm.membership import rejoins
        from .features import peer_statistics_private
        from .setup import collectively

        self.rank, self.opened = context.comm.rank, False
        self.holder = None if rejoins(context.comm) else 0  # a rejoiner learns it when admitted
        self.active, self.continuing = self.rank == self.holder, context.resuming
        self.private = peer_statistics_private(context.config)
        out = context.config.out_dir
        if out is None and not self._has_location():
            raise ValueError(
                f"loggers: {self.name} needs a run directory (out_dir) or a "
                f"location option ({self._location_hint()})"
            )
        self.context, self.run_dir = context, Path(out) if out is not None else None
        self.provenance = context.provenance or {}
        if not context.resuming:  # a resumed run opens once its run id is loaded
            collectively(context.comm, self._open)
            if context.config.on_peer_loss == "continue" and self.holder is not None:
                self._share_run_id(context.comm)

    def _share_run_id(self, comm: Comm) -> None:
        """Every peer learns the tracker's run id (and checkpoints it): whichever member holds the
        trackers later continues that run (collective)."""
        known = [_run_id(g, self.name) for g in comm.allgather_bytes(_id_bytes(self.run_id))]
        self.run_id = next((i for i in known if i), None)

    def handed(self) -> Dict[str, torch.Tensor]:
        """What a joining peer is handed of the trackers (`churn_run.TrainingState`, raw tensors):
        the run id (`RUN_ID_BYTES` bytes) and who held them from which step (`holders`), so that
        a joiner that holds them later continues their runs (a --rejoin process knows neither)."""
        run_id = torch.frombuffer(bytearray(_id_bytes(self.run_id)), dtype=torch.uint8)
        holders = torch.tensor(self.holders, dtype=torch.int64).reshape(-1, 2)
        return {"run_id": run_id, "holders": holders}

    def take_handed(self, state: Dict[str, torch.Tensor]) -> None:
        """Take what the members handed (`handed`), this joiner's own view replaced."""
        self.run_id = _run_id(bytes(state["run_id"].numpy().tobytes()), self.name) or None
        self.holders = [[int(a), int(h)] for a, h in state["holders"].tolist()]

    def _open(self) -> None:
        """Open the tracker (its holder), every failure one line naming the tracker."""
        if not self.active or self.opened:
            return
        try:
            self.open(self.context, self.run_dir)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tracker library's own errors, in one line
            raise ValueError(f"loggers: {self.name} could not start: {one_line(exc)}") from None
        self.opened = True

    def on_record(self, record: Dict[str, Any]) -> None:
        step = self.step = int(record.get("step", 0))  # every member's: it may hold them next
        if self.active:
            self._open()
            if step > self.logged.get(record.get("kind", "record"), -1):  # not yet in its run
                # only what of a record may leave this peer (none of its own figures if private)
                self.write(record_scalars(shareable(record, self.private)), step)

    def on_membership(self, step: int, members: Tuple[int, ...]) -> None:
        """The lowest member holds the trackers: a holder that leaves (or sees a lower peer come
        back) flushes and closes its tracker now; the new holder continues the same tracker run
        with the records after `step` (those up to it are the old members'), at its next record
        (or the summary). A lost holder closes nothing: its events up to its loss stay."""
        holder = min(members)
        if holder == self.holder:
            return
        if self.active and self.opened:
            self.release()
        self.opened, self.holder = False, holder
        self.holders.append([step, holder])
        self.active = holder == self.rank
        if self.active:
            self.step, self.continuing = step, True

    def close(self) -> None:
        """A failing run (an exception on its way out) ends the tracker's run now, as failed; a
        run that ends normally ends it in `on_summary`, with the summary."""
        if self.active and self.opened and sys.exc_info()[0] is not None:
            self._end(None)

    def on_summary(self, summary: Optional[Dict[str, Any]]) -> None:
        if self.active and (self.opened or summary is not None):
            self._open()  # (a holder since its last record opens now)
            self._end(summary)

    def _end(self, summary: Optional[Dict[str, Any]]) -> None:
        self.active = False
        self.finish(summary)

    def run_name(self) -> Optional[str]:
        """The run directory's name: what each tracker names its run."""
        return self.run_dir.resolve().name if self.run_dir is not None else None

    def run_files(self) -> List[Path]:
        """The run directory's `RUN_FILES` that exist."""
        if self.run_dir is None:
            return []
        return [self.run_dir / f for f in RUN_FILES if (self.run_dir / f).is_file()]

    def state_dict(self) -> Dict[str, Any]:
        saved = (("run_id", self.run_id), ("step", self.step), ("holders", self.holders))
        return {k: v for k, v in saved if v is not None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.run_id, self.step = state.get("run_id", self.run_id), state.get("step", self.step)
        self.holders = [list(h) for h in state.get("holders", self.holders)]
        self._open()  # a resumed run: its tracker's run continues (at set-up, inside the resume)

    # ---- what each tracker does ------------------------------------------------------------------
    def _has_location(self) -> bool:
        return False

    def _location_hint(self) -> str:
        return ""

    def open(self, context: SetupContext, run_dir: Optional[Path]) -> None:
        raise NotImplementedError

    def write(self, scalars: Dict[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self, summary: Optional[Dict[str, Any]]) -> None:
        """End the tracker's run: with the run's summary, or None when the run failed."""
        raise NotImplementedError

    def release(self) -> None:
        """Hand the tracker's run over (its holder left): flush and close, without ending it."""


def _id_bytes(run_id: Optional[str]) -> bytes:
    """A run id as `RUN_ID_BYTES` bytes (zero-padded; none: all zeros)."""
    return (run_id or "").encode().ljust(RUN_ID_BYTES, b"\0")[:RUN_ID_BYTES]


def _run_id(raw: bytes, name: str) -> str:
    """The run id of `_id_bytes`'s bytes from another peer ("" for none); a one-line error where
    they are not one."""
    try:
        return raw.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(
            f"loggers: {name}: another peer sent a run id that is not ASCII text "
            f"({raw[:16]!r}...): the peers run different versions of gossip_powersgd"
        ) from None


__all__ = ["RUN_FILES", "RUN_ID_BYTES", "Tracker"]
