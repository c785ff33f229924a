"""Curious-neighbour observers as a config-driven feature (`training/features.py`).

The keys ``observers`` (the ranks whose received messages are recorded) and ``observe_every``
(also nested: ``observe: {ranks: [3], every: 2}``) turn on `ObserverHooks`, which records the views
of the ranks it names from inside `train` (with `views.ViewRecorder`); the summary table gains the
recorded bytes. Recording changes no bit of the run, so both keys are left out of
the checkpoint's config hash (a run may resume with other observers).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import torch

from gossip_powersgd.privacy.views import ViewRecorder, check_observe_every, observed_dir
from gossip_powersgd.training.features import Feature, Key, register
from gossip_powersgd.training.hooks import SetupContext, TrainingHooks

__all__ = ["OBSERVERS", "ObserverHooks", "observer_hook", "observer_summary_rows"]


class ObserverHooks(TrainingHooks):
    """Record the views of the ranks in `observers` during `train(..., hooks=[ObserverHooks(...)])`.

    Views go to `directory` (default `<out_dir>/observed/rank-K`, or kept in memory in
    `recorder.records` when the run has no `out_dir`). Every rank runs the hook; only the observers
    record. Each eval record gains `observed_bytes`: the message bytes this rank has recorded
    (0 on the other ranks).
    """

    name = "observers"
    optional = True  # recording changes no bit: a run may resume with observers added or removed

    def __init__(self, observers: Iterable[int], observe_every: int = 1, directory=None):
        self.observers = sorted({int(k) for k in observers})
        self.observe_every = check_observe_every(observe_every)
        self.directory = directory
        self.recorder: Optional[ViewRecorder] = None
        self._restored_bytes = 0
        self._comm = None

    def setup(self, context: SetupContext) -> None:
        comm = self._comm = context.comm
        bad = [k for k in self.observers if not 0 <= k < comm.size]
        if bad:
            raise ValueError(
                f"observers {bad} are not ranks of this {comm.size}-peer run; "
                f"name ranks 0..{comm.size - 1}"
            )
        if comm.rank not in self.observers:
            return
        directory = self.directory
        if directory is None and context.config.out_dir is not None:
            directory = observed_dir(context.config.out_dir, comm.rank)
        self.recorder = ViewRecorder(context.algorithm, directory, self.observe_every)

    def after_gossip(self, step: int) -> None:
        if self.recorder is not None:
            self.recorder.flush()

    @property
    def bytes_recorded(self) -> int:
        """Message bytes this rank recorded in this run, resumed parts included; 0 on a rank that
        does not observe in this run, even one that observed before the resume (a dropped
        observer: its earlier count stays in the checkpoint, see `state_dict`)."""
        return self._total() if self.recorder is not None else 0

    def _total(self) -> int:
        mine = self.recorder.bytes_recorded if self.recorder is not None else 0
        return self._restored_bytes + mine

    def on_evaluation(self, record: Dict[str, Any]) -> Dict[str, Any]:
        return {"observed_bytes": self.bytes_recorded}

    def summary_fields(self) -> Dict[str, Any]:
        """What summary.json adds for a run with observers (collective): every rank's recorded
        message bytes, in rank order (0 on the ranks that do not observe)."""
        counts = torch.zeros(self._comm.size, dtype=torch.float64)
        counts[self._comm.rank] = float(self.bytes_recorded)
        self._comm.allreduce_(counts, op="sum", metric=True)
        return {
            "observers": list(self.observers),
            "observe_every": self.observe_every,
            "observed_bytes": [int(c) for c in counts],
        }

    def state_dict(self) -> Dict[str, Any]:
        """The bytes of this rank's view so far, kept while it is not an observer: a resume that
        makes it one again (with no gap in its view) counts on from them."""
        return {"bytes_recorded": self._total()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._restored_bytes = int(state.get("bytes_recorded", 0))


def observer_hook(config) -> Optional[ObserverHooks]:
    """The hook a run with `config` needs: `ObserverHooks` for its ``observers`` (recording every
    ``observe_every``-th step), or None when the config names no observer."""
    if not config.observers:
        return None
    return ObserverHooks(config.observers, config.observe_every)


def observer_summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    """The summary table's row for recorded views; none for a run without observers."""
    if "observed_bytes" not in summary:
        return []
    counts = summary["observed_bytes"]
    per_rank = ", ".join(f"rank {k}: {counts[k] / 1e6:.3f}" for k in summary["observers"])
    return [
        (
            f"observed message MB (every {summary['observe_every']} step(s))",
            f"{sum(counts) / 1e6:.3f} ({per_rank})",
        )
    ]


def _ranks(value: Any) -> List[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not (
        isinstance(value, (list, tuple))
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"bad value for 'observers': {value!r} is not a list of ranks")
    return [int(v) for v in value]


def _validate(config) -> None:
    ranks = config.observers
    if not (all(k >= 0 for k in ranks) and len(set(ranks)) == len(ranks)):
        raise ValueError(
            f"bad value for 'observers': {ranks!r} (must be distinct ranks >= 0, e.g. [3])"
        )
    if config.observe_every < 1:
        raise ValueError(
            f"bad value for 'observe_every': {config.observe_every!r} (must be >= 1 (steps))"
        )
    if config.observe_every != 1 and not ranks:
        raise ValueError(
            "observe_every is for observers (the ranks whose messages are recorded): set "
            "observers (e.g. [3]), or drop the key"
        )


OBSERVERS = register(
    Feature(
        name="observers",
        section="observe",
        keys=[
            Key(
                "observers",
                "list",
                [],
                nested="ranks",
                coerce=_ranks,
                type_name="list of ranks",
                recording=True,
                doc="Curious neighbours: the ranks whose received messages are recorded, under "
                "<out_dir>/observed/rank-K (in memory without out_dir); [] = none. Recording "
                "changes nothing, so a run may resume with other observers: they record from the "
                "step it resumes at.",
            ),
            Key(
                "observe_every",
                "int",
                1,
                nested="every",
                recording=True,
                doc="Curious neighbours: record every k-th gossip step (Choco reconstruction needs 1).",
            ),
        ],
        validate=_validate,
        # Observers go last: they record the algorithm the DP hook (or a mechanism) may have rebuilt.
        hooks=lambda config: [h for h in (observer_hook(config),) if h is not None],
        summary_rows=observer_summary_rows,
    )
)
