"""Curious-neighbour observers as a config-driven feature (`training/features.py`).

The keys ``observers`` (the ranks whose received messages are recorded) and ``observe_every``
(also nested: ``observe: {ranks: [3], every: 2}``) turn on `views.ObserverHooks`; the summary
table gains the recorded bytes. Recording changes no bit of the run, so both keys are left out of
the checkpoint's config hash (a run may resume with other observers).
"""

from __future__ import annotations

from typing import Any, List

from gossip_powersgd.privacy.views import observer_hook, observer_summary_rows
from gossip_powersgd.training.features import Feature, Key, register

__all__ = ["OBSERVERS"]


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
