"""Recorded views: every message an honest-but-curious peer receives, saved as it was delivered.

Threat model: a peer follows the protocol, does not collude, and sees exactly the bytes the
transport delivers to it, plus what it legitimately knows: its own model, the factors it shares
with each neighbour (PowerGossip), the seeds and compressor of the run (Choco, DeepSqueeze).

`ViewRecorder(algorithm, directory, observe_every)` re-points the algorithm's communicator at a
`RecordingCommunicator`, which passes every exchange through to the real transport unchanged (the
transport still counts the bytes, once) and then copies what was delivered. Only `exchange` is
recorded: collectives (the metric all-reduces, the all-reduce baselines) are not gossip messages.
`observing.ObserverHooks` does the same from inside `train(..., hooks=[...])` for the ranks it names.

On-disk format, under `<run>/observed/rank-K/` (every file is `torch.save` of plain tensors,
numbers, strings, lists and dicts, so `torch.load(path, weights_only=True)` reads it):

    meta.pt            {"format": 1, "observer": K, "algorithm": name, "neighbors": [...],
                        "observe_every": e, "shapes": [[...], ...], "dtype": "float32",
                        + the fields of the algorithm's message layout, e.g.
                          PowerGossip: "groups": [[indices, rows, cols, rank], ...],
                                       "exact_indices": [...]
                          Choco / DeepSqueeze: "compressor": spelling, "seed": s}
    step-00000012.pt   {"format": 1, "step": 12,
                        "senders": [j, ...]             the neighbours whose messages arrived in
                                                        this step (on a schedule or a directed
                                                        graph only the step's active ones; [] on
                                                        a step in which the observer was idle),
                        "own": [tensor per parameter]   the observer's parameters when it sent
                                                        the step's first message (its trajectory;
                                                        on an idle step, its parameters then),
                        "messages": [{"exchange": k (0-based within the step), "sender": j,
                                      "kind": "right" | "left" | "" (PowerGossip half-step),
                                      "tensor": the message exactly as delivered,
                                      + what the layout's `annotate` adds, e.g. PowerGossip's
                                      "factors": {"g": the factor of group g it was computed with,
                                                  Q (batch, cols, r) on a right half-step, P
                                                  (batch, rows, r) on a left one}},
                                     ...]}

Everything algorithm-specific comes from the algorithm's declared message layout
(`algorithms.layout`): its fields in meta.pt, each message's annotation, and, when read back,
`ObservedView.decode`, which says which of the sender's tensors a message holds.

`step` is the gossip step's 0-based index (`algorithm.steps` while it runs). Only steps with
`step % observe_every == 0` are recorded, which bounds the size; `bytes_recorded` counts the bytes of
the delivered messages kept (not the observer's own model or the factors). On a changing topology
(a schedule, a directed graph) a message is recorded only from the neighbours active in that step,
and a selected step in which the observer exchanged nothing still gets its (empty) record, so that
the steps of a view stay consecutive.

Nothing is written before the first step is recorded: a run that fails before training (e.g. a
refused resume) leaves no view behind. A resumed run records from the step it resumes at, into the
same directory (the steps before it are those the interrupted run recorded); one that would leave
a gap there (the view ends more than `observe_every` steps before the resumed step, because a
stretch ran without this observer) is refused at its first record, naming the directory to move
away. A write the process
did not survive (SIGKILL) can leave a temporary `.NAME.XXXX.tmp` of the atomic writer; those are
removed when recording starts, never a complete file.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from gossip_powersgd.algorithms.layout import MessageLayout, Part, Undeclared
from gossip_powersgd.algorithms.registry import REGISTRY
from gossip_powersgd.comm.base import Tensor, nbytes
from gossip_powersgd.privacy.view_files import STEP_FILE as _STEP_FILE
from gossip_powersgd.privacy.view_files import load_view_file as _load
from gossip_powersgd.utils import atomic_write, one_line

__all__ = [
    "FORMAT",
    "ObservedView",
    "RecordingCommunicator",
    "ViewRecorder",
    "load_view",
    "observed_dir",
]

#: Version of the on-disk format described in the module docstring.
FORMAT = 1


def observed_dir(run_dir, rank: int) -> Path:
    """Where rank `rank`'s recorded view of run `run_dir` lives: `<run>/observed/rank-K`."""
    return Path(run_dir) / "observed" / f"rank-{rank}"


def check_observe_every(value) -> int:
    """`value` as an int, refusing anything that is not an integer >= 1."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or int(value) != value
        or value < 1
    ):
        raise ValueError(
            f"observe_every must be an integer >= 1 (record every k-th step), got {value!r}"
        )
    return int(value)


class RecordingCommunicator:
    """A communicator that behaves exactly like `inner` and reports every completed exchange.

    `exchange` runs the inner transport's (which checks, delivers and counts the bytes) and then
    calls `listener(send, recv)` with the filled receive buffers; the listener must copy what it
    keeps. Everything else (rank, neighbours, stats, collectives) is the inner communicator's.
    """

    def __init__(self, inner, listener: Callable[[Dict[int, Tensor], Dict[int, Tensor]], None]):
        self.inner = inner
        self.listener = listener

    def exchange(
        self, send: Dict[int, Tensor], recv: Dict[int, Tensor], step: Optional[int] = None
    ) -> None:
        """`inner.exchange(send, recv, step)`, then the listener sees what was delivered (a step
        of a changing topology in which this peer has no neighbour delivers nothing)."""
        self.inner.exchange(send, recv, step)
        if recv:
            self.listener(send, recv)

    def exchange_directed(
        self, send: Dict[int, Tensor], recv: Dict[int, Tensor], step: int
    ) -> None:
        """`inner.exchange_directed(send, recv, step)` (push-sum), then the listener."""
        self.inner.exchange_directed(send, recv, step)
        if recv:
            self.listener(send, recv)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"RecordingCommunicator({self.inner!r})"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def layout_type(algorithm_or_name) -> type:
    """The `MessageLayout` class an algorithm (instance, class or registered name) declares;
    `Undeclared` (records, cannot decode) for one that declares none."""
    if isinstance(algorithm_or_name, str):
        cls = REGISTRY.get(algorithm_or_name)
        if cls is None:
            raise ValueError(
                f"the view was recorded from algorithm {algorithm_or_name!r}, which is "
                f"not registered here (registered: {', '.join(sorted(REGISTRY))}): "
                "import the module that registers it"
            )
    else:
        cls = algorithm_or_name if isinstance(algorithm_or_name, type) else type(algorithm_or_name)
    layout = getattr(cls, "layout", None)
    return layout if isinstance(layout, type) and issubclass(layout, MessageLayout) else Undeclared


def view_meta(
    algorithm, observe_every: int, layout: Optional[MessageLayout] = None
) -> Dict[str, Any]:
    """What a reader of the view needs to decode its messages (see the module docstring)."""
    comm = algorithm.comm
    if layout is None:
        layout = layout_type(algorithm).of(algorithm)
    meta: Dict[str, Any] = {
        "format": FORMAT,
        "observer": int(comm.rank),
        "algorithm": algorithm.name,
        "neighbors": [int(j) for j in comm.neighbors],
        "observe_every": int(observe_every),
        "shapes": [list(p.shape) for p in algorithm.params],
        "dtype": _dtype_name(algorithm.dtype),
    }
    meta.update(layout.fields)
    return meta


class ViewRecorder:
    """Record every message `algorithm`'s peer receives, on the steps `observe_every` selects.

    Installs itself by replacing `algorithm.comm` with a `RecordingCommunicator` over it (what is
    sent, received and counted does not change). Call `flush()` after each `algorithm.step()` (the
    hook does) to write the step's record; `close()` writes what is pending. With `directory=None`
    the records are kept in `records` instead of written.
    """

    def __init__(self, algorithm, directory=None, observe_every: int = 1):
        self.algorithm = algorithm
        self.observe_every = check_observe_every(observe_every)
        self.directory = Path(directory) if directory is not None else None
        self.records: List[Dict[str, Any]] = []
        self.bytes_recorded = 0
        self._pending: Optional[Dict[str, Any]] = None
        self._exchanges = 0  # exchanges so far in the step being recorded
        self._last_step: Optional[int] = None  # the newest step recorded
        self._started = False  # meta.pt written (at the first record, see the module docstring)
        self.layout = layout_type(algorithm).of(algorithm)
        self.meta = view_meta(algorithm, self.observe_every, self.layout)
        #: Idle steps get an empty record only where a step can be idle (a changing topology).
        self._record_idle = not getattr(algorithm.comm, "is_static", True)
        if self.directory is not None:
            self._check_earlier_meta()
        algorithm.comm = RecordingCommunicator(algorithm.comm, self._on_exchange)

    def _check_earlier_meta(self) -> None:
        """A resumed run records into the interrupted run's view: refuse one recorded otherwise."""
        path = self.directory / "meta.pt"
        if not path.exists():
            return
        earlier = _load(path, "meta")
        if earlier != self.meta:
            keys = sorted(
                k for k in set(earlier) | set(self.meta) if earlier.get(k) != self.meta.get(k)
            )
            raise ValueError(
                f"recorded view file {path} was written with other settings "
                f"({', '.join(keys)} differ): resume with the observe_every it was "
                "recorded with, or move that directory away"
            )

    def _start(self, first: int) -> None:
        """At the first record (of step `first`): the directory, its stale temporary files gone,
        meta.pt; a view the steps before `first` did not all add to is refused (see
        `_check_no_gap`)."""
        self._check_no_gap(first)
        self._started = True
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            if _TEMPORARY.match(entry.name):
                try:
                    entry.unlink()
                except FileNotFoundError:
                    pass
        self._save(self.directory / "meta.pt", self.meta)

    def _check_no_gap(self, first: int) -> None:
        """A resumed run continues the interrupted run's view: refuse one whose newest step is
        more than `observe_every` before `first` (a stretch resumed without this observer left
        steps unrecorded), which would read as a consecutive view."""
        if not self.directory.is_dir():
            return
        steps = [int(n[5:-3]) for n in os.listdir(self.directory) if _STEP_FILE.match(n)]
        last = max(steps, default=None)
        if last is not None and first > last + self.observe_every:
            raise ValueError(
                f"recorded view {self.directory} ends at step {last}, but this run records "
                f"from step {first} (steps {last + 1}..{first - 1} ran without this observer): "
                "move that directory away to record a new view from this step"
            )

    def _save(self, path: Path, payload: Dict[str, Any]) -> None:
        try:
            _save(path, payload)
        except OSError as exc:
            raise OSError(
                f"rank {self.meta['observer']}: cannot write the recorded view file "
                f"{path}: {exc.strerror or one_line(exc)}; free space or choose another "
                "out_dir (--set out_dir=...)"
            ) from None

    def _on_exchange(self, send: Dict[int, Tensor], recv: Dict[int, Tensor]) -> None:
        algorithm = self.algorithm
        step = int(algorithm.steps)
        if step % self.observe_every:
            return
        if self._pending is not None and self._pending["step"] != step:
            self.flush()
        if self._pending is None:
            self._pending = self._new_record(step)
            self._exchanges = 0
        senders = self._pending["senders"]
        # The peers whose message arrived: the neighbours of this step's graph that sent to this
        # peer (on a schedule or a directed graph), never the union graph's.
        for j in sorted(recv):
            message = {
                "exchange": self._exchanges,
                "sender": int(j),
                "kind": "",
                "tensor": recv[j].detach().cpu().clone(),
            }
            message.update(self.layout.annotate(algorithm, int(j)))
            if int(j) not in senders:
                senders.append(int(j))
            self._pending["messages"].append(message)
            self.bytes_recorded += nbytes(recv[j])
        self._exchanges += 1

    def _new_record(self, step: int) -> Dict[str, Any]:
        # The observer's own model before this step's gossip changes it: no algorithm updates
        # its parameters before its first exchange of a step.
        return {
            "format": FORMAT,
            "step": step,
            "senders": [],
            "messages": [],
            "own": [p.detach().cpu().clone() for p in self.algorithm.params],
        }

    def flush(self) -> None:
        """Write (or keep) the record of the step in progress, if it has one. Called after a step
        in which this peer exchanged nothing (idle on a schedule), it records that step empty."""
        record, self._pending = self._pending, None
        if record is None:
            done = int(self.algorithm.steps) - 1  # the step that just ended
            if (
                not self._record_idle
                or done < 0
                or done % self.observe_every
                or (self._last_step is not None and done <= self._last_step)
            ):
                return
            record = self._new_record(done)
        self._last_step = record["step"]
        if self.directory is None:
            self.records.append(record)
        else:
            if not self._started:
                self._start(record["step"])
            self._save(self.directory / f"step-{record['step']:08d}.pt", record)

    def close(self) -> None:
        """Flush, and give the algorithm its own communicator back."""
        self.flush()
        if isinstance(self.algorithm.comm, RecordingCommunicator):
            self.algorithm.comm = self.algorithm.comm.inner


#: The temporary files `utils.atomic_write` makes for this directory's files: `.NAME.XXXXXXXX.tmp`.
_TEMPORARY = re.compile(r"^\.(?:meta|step-\d+)\.pt\.[^.]+\.tmp$")


def _save(path: Path, payload: Dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write(path, buffer.getvalue())


class ObservedView:
    """A recorded view read back: `meta` and the step records in step order."""

    def __init__(self, meta: Dict[str, Any], records: List[Dict[str, Any]]):
        self.meta = meta
        self.records = sorted(records, key=lambda r: r["step"])

    @property
    def steps(self) -> List[int]:
        return [r["step"] for r in self.records]

    def own_trajectory(self) -> Dict[int, List[Tensor]]:
        """The observer's own parameters at each recorded step (before that step's gossip)."""
        return {r["step"]: r["own"] for r in self.records}

    def layout(self) -> MessageLayout:
        """The recorded algorithm's message layout, built from this view's meta."""
        if not hasattr(self, "_layout"):
            self._layout = layout_type(self.meta["algorithm"])(self.meta)
        return self._layout

    def decode(self, message: Dict[str, Any]) -> List[Part]:
        """What one message of `messages_from` holds, as the layout's `Part`s."""
        return self.layout().decode(message)

    def messages_from(self, sender: int) -> List[Dict[str, Any]]:
        """`sender`'s messages in the order they arrived, each with its "step" added."""
        if sender not in self.meta["neighbors"]:
            raise ValueError(
                f"peer {sender} is not a neighbour of observer {self.meta['observer']} "
                f"(its neighbours: {self.meta['neighbors']})"
            )
        return [
            dict(m, step=r["step"])
            for r in self.records
            for m in r["messages"]
            if m["sender"] == sender
        ]


def load_view(source) -> ObservedView:
    """Read a view: a `<run>/observed/rank-K` directory, or a `ViewRecorder` kept in memory.

    Any file that is not a view file this version wrote (empty, truncated, changed after it was
    written (a zip member whose CRC-32 fails or that is marked a directory), not a regular file,
    holding objects beyond tensors and plain containers, or of the wrong shape) is a one-line
    ValueError naming it; nothing in it is unpickled beyond what `weights_only=True` allows."""
    if isinstance(source, ViewRecorder):
        return ObservedView(source.meta, list(source.records))
    directory = Path(source)
    meta_path = directory / "meta.pt"
    if not meta_path.exists():
        raise ValueError(
            f"{directory} holds no recorded view (no meta.pt): record one with "
            "ObserverHooks or ViewRecorder"
        )
    meta = _load(meta_path, "meta")
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{meta_path} has view format {meta.get('format')!r}; this version reads "
            f"format {FORMAT}"
        )
    records = [
        _load(directory / name, "step")
        for name in sorted(os.listdir(directory))
        if _STEP_FILE.match(name)
    ]
    return ObservedView(meta, records)
