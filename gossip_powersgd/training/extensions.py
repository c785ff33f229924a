"""Hooks named in the config: experiment trackers (`loggers:`) and user hooks (`hooks:`).

Both keys take a list whose entries are a name, or a one-key mapping from the name to its options::

    loggers: [tensorboard, {wandb: {project: my-study, mode: offline}}, mlflow]
    hooks: [my_pkg.hooks:GradNormHook, {my_pkg.hooks:EarlyStop: {patience: 3}}]

On the command line: ``--set loggers=[tensorboard]`` or ``--set 'hooks=[my_pkg.mod:Class]'``.

A tracker logs, from rank 0 only, every record the run writes to rank 0's metrics file: the
``eval`` records (accuracies, losses, consensus distance, traffic) and, with ``log_every: k``, the
``log`` records every k steps (training loss, consensus distance, traffic). Each metric is logged as
``<kind>/<key>`` at the record's step. Where the peers' statistics are private (differential
privacy, `partition: local`, unless `release_peer_statistics: true`) a tracker logs only what of a
record may leave rank 0 (`evaluation.shareable`): none of rank 0's own figures (its training loss,
its accuracy and loss, its epsilon), which stay in its own metrics file. Each tracker's
package is an optional extra (``pip install 'gossip_powersgd[tracking]'``):

- ``tensorboard``: ``SummaryWriter(**options)``, event files under ``<run>/tensorboard`` (option
  ``log_dir``; any other of SummaryWriter's own, e.g. ``flush_secs``).
- ``wandb``: ``wandb.init(dir=<run>, config=<the run's config>, **options)`` (any of wandb.init's
  own but config, id and resume: ``project``, ``mode`` — e.g. ``offline`` —, ``name``,
  ``entity``, ``tags``, ...); a resumed run continues the same W&B run. A ``dir`` it cannot write
  is refused (W&B would fall back to the system temp folder).
- ``mlflow``: a run in the experiment ``experiment`` (default ``gossip_powersgd``) of
  ``tracking_uri`` (default the SQLite database ``<run>/mlflow.db``, MLflow's recommended backend;
  an explicit file store URI is taken with MLflow 3's opt-in MLFLOW_ALLOW_FILE_STORE), the config
  as its parameters; a resumed run continues the same MLflow run.

An option a tracker does not take is a one-line error naming each such option and the nearest one
it does take. Trackers open at set-up (a resumed run's once its checkpoint is loaded), so one that
cannot start stops the run before its first step.

A user hook is a `TrainingHooks` subclass, instantiated with the entry's options as keyword
arguments on every peer (see `hooks.py` for its extension points; `after_step(step, loss)` sees
each step's training loss on that peer).
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..specs import import_object
from ..utils import one_line
from .features import Feature, Key, register
from .hooks import SetupContext, TrainingHooks


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


def _scalars(record: Dict[str, Any]) -> Dict[str, float]:
    """The record's finite numbers, keyed ``<kind>/<key>`` (step and epoch are the axes)."""
    kind = record.get("kind", "record")
    return {
        f"{kind}/{k}": float(v)
        for k, v in record.items()
        if k not in ("kind", "step")
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


class Tracker(TrainingHooks):
    """Base of the experiment trackers: active on rank 0 only; subclasses open, write and close.

    A tracker is opened at set-up (a resumed run's: when its checkpointed state, the tracker's run
    id, is loaded, still before the first step), so that a tracker that cannot start stops the run
    at once, with one line on every rank, not at its first record mid-run."""

    package = ""  #: the module that must import (named in the error when it does not)

    def __init__(self, **options: Any):
        self.options = options
        self.active = False
        self.opened = False
        self.run_id: Optional[str] = None  # a resumed run continues the tracker's run

    @property
    def key(self) -> str:
        return f"logger.{self.name}"

    @classmethod
    def check_installed(cls) -> None:
        try:
            importlib.import_module(cls.package)
        except ImportError:
            raise ValueError(
                f"loggers: {cls.name} needs the {cls.package} package: "
                "pip install 'gossip_powersgd[tracking]' (or drop it from loggers)"
            ) from None

    @classmethod
    def accepted_options(cls) -> List[str]:
        """The options an entry may give: the tracker's own parameters (see each subclass)."""
        raise NotImplementedError

    @classmethod
    def option_mistakes(cls, options: Dict[str, Any]) -> Optional[str]:
        """The entry's options the tracker does not take, each with the nearest one it does, and
        the list of those it does, as one clause; None when every option is one of them."""
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
        from .features import peer_statistics_private
        from .setup import collectively

        self.active, self.opened = context.comm.rank == 0, False
        self.private = peer_statistics_private(context.config)
        if self.active:
            out = context.config.out_dir
            if out is None and not self._has_location():
                raise ValueError(
                    f"loggers: {self.name} needs a run directory (out_dir) or a "
                    f"location option ({self._location_hint()})"
                )
            self.context, self.run_dir = context, Path(out) if out is not None else None
        if not context.resuming:  # a resumed run opens once its run id is loaded
            collectively(context.comm, self._open)

    def _open(self) -> None:
        """Open the tracker (rank 0), every failure one line naming the tracker."""
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
        if self.active:
            self._open()
            from .evaluation import shareable

            self.write(_scalars(shareable(record, self.private)), int(record.get("step", 0)))

    def close(self) -> None:
        if self.active and self.opened:
            self.active = False
            self.finish()

    def state_dict(self) -> Dict[str, Any]:
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.run_id = state.get("run_id", self.run_id)
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

    def finish(self) -> None:
        raise NotImplementedError


def _parameters(function, reserved: Tuple[str, ...] = ()) -> List[str]:
    """The keyword parameters of `function` (a tracker library's constructor), less `reserved`."""
    import inspect

    return [
        name
        for name, p in inspect.signature(function).parameters.items()
        if name != "self"
        and name not in reserved
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


class TensorBoardTracker(Tracker):
    """Options: ``torch.utils.tensorboard.SummaryWriter``'s (log_dir: ``<run>/tensorboard``)."""

    name = "tensorboard"
    package = "tensorboard"

    @classmethod
    def accepted_options(cls) -> List[str]:
        from torch.utils.tensorboard import SummaryWriter

        return _parameters(SummaryWriter.__init__)

    def _has_location(self) -> bool:
        return "log_dir" in self.options

    def _location_hint(self) -> str:
        return "{tensorboard: {log_dir: DIR}}"

    def open(self, context, run_dir):
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.options.get("log_dir", run_dir / "tensorboard" if run_dir else None)
        self.writer = SummaryWriter(**{**self.options, "log_dir": str(log_dir)})

    def write(self, scalars, step):
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def finish(self):
        self.writer.close()


class WandbTracker(Tracker):
    """Options: ``wandb.init``'s but config, id and resume (see the module docstring)."""

    name = "wandb"
    package = "wandb"

    @classmethod
    def accepted_options(cls) -> List[str]:
        import wandb

        return _parameters(wandb.init, reserved=("config", "id", "resume"))

    def _has_location(self) -> bool:
        return "dir" in self.options

    def _location_hint(self) -> str:
        return "{wandb: {dir: DIR}}"

    def open(self, context, run_dir):
        import tempfile

        import wandb

        options = dict(self.options)
        options.setdefault("dir", str(run_dir))
        options.setdefault("project", "gossip_powersgd")
        folder = Path(options["dir"]).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ValueError(
                f"loggers: wandb cannot write to its dir {folder} ({exc.strerror or exc}), and "
                "W&B would fall back to the system temp folder: give {wandb: {dir: DIR}} a "
                "folder it can write"
            ) from None
        if self.run_id:
            options.update(id=self.run_id, resume="allow")
        self.run = wandb.init(config=context.config.to_dict(), **options)
        self.run_id = self.run.id

    def write(self, scalars, step):
        if scalars:
            self.run.log(scalars, step=step)

    def finish(self):
        self.run.finish()


class MLflowTracker(Tracker):
    """Options: ``experiment`` and ``tracking_uri`` (see the module docstring)."""

    name = "mlflow"
    package = "mlflow"

    @classmethod
    def accepted_options(cls) -> List[str]:
        return ["experiment", "tracking_uri"]

    def _has_location(self) -> bool:
        return "tracking_uri" in self.options

    def _location_hint(self) -> str:
        return "{mlflow: {tracking_uri: URI}}"

    def open(self, context, run_dir):
        import logging

        from mlflow.tracking import MlflowClient  # a client, not mlflow's process-global run

        uri = self.options.get("tracking_uri")
        if uri is None:
            uri = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        elif str(uri).startswith("file:") or "://" not in str(uri):  # a file store: opt in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        for chatty in ("mlflow.store.db.utils", "alembic"):  # its schema set-up, at INFO
            logging.getLogger(chatty).setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=str(uri))
        if self.run_id is None:
            name = self.options.get("experiment", "gossip_powersgd")
            found = self.client.get_experiment_by_name(name)
            experiment = found.experiment_id if found else self.client.create_experiment(name)
            self.run_id = self.client.create_run(experiment).info.run_id
            for key, value in context.config.to_dict().items():
                self.client.log_param(self.run_id, key, str(value)[:500])

    def write(self, scalars, step):
        for key, value in scalars.items():
            self.client.log_metric(self.run_id, key.replace("/", "."), value, step=step)

    def finish(self):
        self.client.set_terminated(self.run_id)


TRACKERS = {t.name: t for t in (TensorBoardTracker, WandbTracker, MLflowTracker)}


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
                doc="Experiment trackers that log rank 0's log and eval records: tensorboard | "
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
