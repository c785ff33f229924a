"""Hooks named in the config: experiment trackers (`loggers:`) and user hooks (`hooks:`).

Both keys take a list whose entries are a name, or a one-key mapping from the name to its options::

    loggers: [tensorboard, {wandb: {project: my-study, mode: offline}}, mlflow]
    hooks: [my_pkg.hooks:GradNormHook, {my_pkg.hooks:EarlyStop: {patience: 3}}]

On the command line: ``--set loggers=[tensorboard]`` or ``--set 'hooks=[my_pkg.mod:Class]'``.

A tracker logs, from the lowest member only (rank 0, unless it left under ``on_peer_loss:
continue``: then the next lowest member continues the same tracker runs, `tracker_base`), every
record the run writes to that member's metrics file: the ``eval`` records (accuracies, losses,
consensus distance, traffic) and, with ``log_every: k``, the ``log`` records every k steps
(training loss, consensus distance, traffic), each number as ``<kind>/<key>`` at the record's step,
and at the end the summary's numbers as ``summary/<key>``: the same names in every tracker,
explained in `metric_names.py` (accuracies are fractions in [0, 1]). Each run is named after the
run directory and tagged with the run's provenance (commit, uncommitted changes, versions, backend,
peers, hosts, the launcher's command line); config.yaml and summary.json go with it
(`trackers.py`). Where the peers' statistics are private (differential privacy, `partition: local`,
unless `release_peer_statistics: true`) a tracker logs only what of a record may leave that peer
(`evaluation.shareable`): none of its own figures (its training loss, its accuracy and loss, its
epsilon), which stay in its own metrics file. Each tracker's package is an optional extra (``pip
install 'gossip_powersgd[tracking]'``):

- ``tensorboard``: ``SummaryWriter(**options)``, event files under ``<run>/tensorboard`` (option
  ``log_dir``; any other of SummaryWriter's own, e.g. ``flush_secs``); the config as hparams.
- ``wandb``: ``wandb.init(dir=<run>, config=<the run's config>, **options)`` (any of wandb.init's
  own but config, id and resume: ``project``, ``mode`` — e.g. ``offline`` —, ``name``,
  ``entity``, ``tags``, ...); a resumed run continues the same W&B run. A ``dir`` it cannot write
  is refused (W&B would fall back to the system temp folder).
- ``mlflow``: a run in the experiment ``experiment`` (default ``gossip_powersgd``) of
  ``tracking_uri`` (default the SQLite database ``<run>/mlflow.db``, MLflow's recommended backend,
  artifacts in ``<run>/mlflow-artifacts``; an explicit file store URI is taken with MLflow 3's
  opt-in MLFLOW_ALLOW_FILE_STORE), the config as its parameters; a resumed run continues the same
  MLflow run.

An option a tracker does not take is a one-line error naming each such option and the nearest one
it does take. Trackers open at set-up (a resumed run's once its checkpoint is loaded), so one that
cannot start stops the run before its first step.

A user hook is a `TrainingHooks` subclass, instantiated with the entry's options as keyword
arguments on every peer (see `hooks.py` for its extension points; `after_step(step, loss)` sees
each step's training loss on that peer).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ..specs import import_object
from .features import Feature, Key, register
from .hooks import TrainingHooks
from .trackers import TRACKERS, Tracker


def entries(value: Any, key: str) -> List[Tuple[str, Dict[str, Any]]]:
    """`value` of config key `key` as [(name, options)], with a one-line ValueError for anything
    but a list of names and one-key {name: {options}} mappings."""
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"bad value for {key!r}: {value!r} is not a list (e.g. {key}: [name])")
    out = []
    for item in value:
        if isinstance(item, str) and item:
            out.append((item, {}))
        elif (
            isinstance(item, dict)
            and len(item) == 1
            and isinstance(next(iter(item)), str)
            and isinstance(next(iter(item.values())), (dict, type(None)))
        ):
            name, options = next(iter(item.items()))
            if not all(isinstance(k, str) for k in (options or {})):
                raise ValueError(f"bad value for {key!r}: the options of {name!r} need string keys")
            out.append((name, dict(options or {})))
        else:
            raise ValueError(
                f"bad value for {key!r}: {item!r} is neither a name nor a one-key "
                f"mapping {{name: {{option: value}}}}"
            )
    return out


def make_trackers(value: Any) -> List[Tracker]:
    """The trackers that config key `loggers` names (one-line ValueError for an unknown name or a
    missing package)."""
    out, mistakes = [], []
    for name, options in entries(value, "loggers"):
        if name not in TRACKERS:
            raise ValueError(f"loggers: unknown logger {name!r}; valid: {', '.join(TRACKERS)}")
        TRACKERS[name].check_installed()
        mistake = TRACKERS[name].option_mistakes(options)
        if mistake:
            mistakes.append(mistake)
        out.append(TRACKERS[name](**options))
    if mistakes:  # every mistake of every entry, in one line
        raise ValueError("loggers: " + "; ".join(mistakes))
    return out


def make_user_hooks(value: Any) -> List[TrainingHooks]:
    """The `TrainingHooks` that config key `hooks` names, each built with its options."""
    out = []
    for spec, options in entries(value, "hooks"):
        try:
            cls = import_object(spec, ["package.module:Class (a TrainingHooks subclass)"])
        except ValueError as exc:
            raise ValueError(f"hooks: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, TrainingHooks)):
            raise ValueError(
                f"hooks: {spec!r} is not a TrainingHooks subclass (subclass "
                "gossip_powersgd.training.hooks.TrainingHooks)"
            )
        try:
            out.append(cls(**options))
        except TypeError as exc:
            raise ValueError(
                f"hooks: {spec!r} does not take the options {sorted(options)} ({exc})"
            ) from None
    return out


def config_hooks(config) -> List[TrainingHooks]:
    """The trackers and user hooks a config names (user hooks first, trackers last, so that they
    log what the other hooks added to a record)."""
    return [*make_user_hooks(config.hooks), *make_trackers(config.loggers)]


def _entry_list(key: str):
    def coerce(value: Any) -> List[Any]:
        entries(value, key)  # a one-line error for a malformed entry
        return list(value) if isinstance(value, (list, tuple)) else [value]

    return coerce


#: `hooks:` and `loggers:` as config-driven features (`features.py`): user hooks run first, trackers
#: after them, so that they log what the other hooks added to a record.
USER_HOOKS = register(
    Feature(
        name="hooks",
        keys=[
            Key(
                "hooks",
                "list",
                [],
                coerce=_entry_list("hooks"),
                type_name="list of specs",
                doc='User hooks built on every peer: "package.module:Class" (a TrainingHooks '
                'subclass) or {"package.module:Class": {option: value}}; [] = none.',
            )
        ],
        validate=lambda config: make_user_hooks(config.hooks),  # they import and build
        hooks=lambda config: make_user_hooks(config.hooks),
    )
)
LOGGERS = register(
    Feature(
        name="loggers",
        keys=[
            Key(
                "loggers",
                "list",
                [],
                coerce=_entry_list("loggers"),
                type_name="list of names",
                doc="Experiment trackers that log the lowest member's (rank 0's unless it left) log "
                "and eval records: tensorboard | "
                "wandb | mlflow, each a name or {name: {option: value}} (see "
                "training/extensions.py); [] = none.",
            )
        ],
        validate=lambda config: make_trackers(config.loggers),  # known, and their package installed
        hooks=lambda config: make_trackers(config.loggers),
    )
)


__all__ = [
    "entries",
    "Tracker",
    "TRACKERS",
    "make_trackers",
    "make_user_hooks",
    "config_hooks",
    "USER_HOOKS",
    "LOGGERS",
]
