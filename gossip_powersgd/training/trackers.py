"""The experiment trackers of `loggers:` (TensorBoard, W&B, MLflow), each run tagged with where it
came from.

Every tracker, on the peer that holds it (the lowest member: rank 0, unless it left under
``on_peer_loss: continue``, when the next lowest takes the same tracker run over: `tracker_base`),
logs each record the run writes to that peer's metrics file and, at the end, the summary, under
the names of `metric_names` (``eval/<key>``, ``log/<key>``,
``summary/<key>``; accuracies as fractions). Each run is named after the run directory and carries
the run's provenance (`provenance.py`): the commit and whether the checkout had uncommitted
changes, the versions, the backend, the number of peers, the hosts and the launcher's command line
(``mpiexec -n 8 python -m gossip_powersgd.cli.train ...``).

- TensorBoard: scalars; the provenance as text (tab "Text", tag ``provenance``); at the end the
  config as hparams with the ``summary/<key>`` numbers as their metrics (tab "HParams").
- W&B: display name, tags (``backend:mpi``, ``peers:8``, ``commit:<12 hex>``,
  ``uncommitted-changes``), notes (the command line), config (the run's config and, under
  ``provenance``, the provenance), summary (``summary/<key>``) and the files config.yaml,
  summary.json and summary.md (under ``<run name>/`` in the W&B run's files).
- MLflow: run name, tags (``git_commit``, ``git_dirty``, ``gossip_powersgd``, each library's
  version, ``backend``, ``world_size``, ``hosts``, ``launcher``, ``command``, ``run_dir``, and
  MLflow's own ``mlflow.source.git.commit``), the config as parameters, metrics, and config.yaml,
  summary.json and summary.md as artifacts (under ``RUN_DIR/mlflow-artifacts`` with the default
  SQLite store). ``mlflow.search_runs()`` needs pandas, which the tracking extra installs.

A run that fails ends its tracker's run as failed (MLflow status FAILED, W&B exit code 1, no
hparams in TensorBoard); a resumed run continues the same W&B and MLflow run, where the records
written after its checkpoint reach the tracker once: MLflow skips the steps its run holds (of each
record kind), TensorBoard purges them (``purge_step``), W&B ignores steps below its run's last one.
W&B resumes no offline run (a new offline run with the same id, of which `wandb sync` keeps one),
so there the tracker logs the records up to the checkpoint again (from the metrics files of the
peers that held it): the newest offline run holds all. A peer that takes the trackers over after a
membership change continues their runs the same way, from the step of the change.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from ..extras import TRACKER_PACKAGES
from .evaluation import shareable
from .metric_names import record_scalars, summary_scalars
from .provenance import command_text, provenance_table, provenance_tags
from .tracker_base import RUN_FILES, Tracker


def _records(run_dir: Path, rank: int, after: int, last: int) -> List[Dict[str, Any]]:
    """The records of rank `rank`'s metrics file whose step is in (after, last]."""
    from .checkpoint import metrics_path

    path, found = metrics_path(run_dir, rank), []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except ValueError:  # a half-written last line
            break
        step = record["step"] = int(record.get("step", 0))
        if step > last:
            break
        if step > after:
            found.append(record)
    return found


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


def _hparam(value: Any):
    """A config value as TensorBoard's hparams take it: a number, a string or a bool."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return "null" if value is None else value
    return json.dumps(value, sort_keys=True)


def after_every_event_file(log_dir: Path) -> None:
    """Wait, if need be, for the second after the newest event file's in `log_dir`. TensorBoard
    reads a log dir's files in name order, and a name is the second it was made in, the host, the
    pid and a count of the process's writers in decimal ("10" sorts before "9"): a run resumed or
    taken over in the same process within a second (in-process peers, a tiny run) was read first,
    before the events it continues, and its purge hid nothing. (A stamp more than 2 s ahead,
    another machine's clock, is not waited for.)"""
    stamps = [p.name.split(".")[3] for p in log_dir.glob("events.out.tfevents.*")]
    newest = max((int(s) for s in stamps if s.isdigit()), default=None)
    if newest is not None and 0 < newest + 1 - time.time() <= 2:
        time.sleep(max(0.0, newest + 1 - time.time()))


class TensorBoardTracker(Tracker):
    """Options: ``torch.utils.tensorboard.SummaryWriter``'s (log_dir: ``<run>/tensorboard``)."""

    name = "tensorboard"
    package = TRACKER_PACKAGES["tensorboard"]

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
        # resumed: hide the first attempt's events after the checkpoint (after its last record
        # before it; none: after step 0, the provenance's); taken over: after the change's step
        purge = {"purge_step": (self.step or 0) + 1} if self.continuing else {}
        if self.continuing and log_dir is not None:
            after_every_event_file(Path(log_dir))
        self.writer = SummaryWriter(**{**purge, **self.options, "log_dir": str(log_dir)})
        tags = provenance_tags(self.provenance)
        if tags and not self.continuing:
            self.writer.add_text("provenance", provenance_table(tags), global_step=0)

    def write(self, scalars, step):
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def finish(self, summary):
        from torch.utils.tensorboard.summary import hparams

        if summary is not None:
            metrics = summary_scalars(summary)
            step = int(summary.get("steps", 0))
            self.write(metrics, step)
            config = {k: _hparam(v) for k, v in self.context.config.to_dict().items()}
            for event in hparams(config, metrics):  # experiment, session start, session end
                self.writer.file_writer.add_summary(event, global_step=step)
        self.writer.close()

    def release(self):
        self.writer.close()


class WandbTracker(Tracker):
    """Options: ``wandb.init``'s but config, id and resume (see the module docstring)."""

    name = "wandb"
    package = TRACKER_PACKAGES["wandb"]

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
        if self.run_name():
            options.setdefault("name", self.run_name())
        origin = self.provenance
        if origin:
            options.setdefault("notes", command_text(origin))
            options["tags"] = [*(options.get("tags") or []), *self._tags(origin)]
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
        config = dict(context.config.to_dict(), **({"provenance": origin} if origin else {}))
        self.run = wandb.init(config=config, **options)
        if self.run_id and not self.run.resumed:  # offline: W&B started the run over
            self._replay_to_checkpoint()
        self.run_id = self.run.id

    def _replay_to_checkpoint(self) -> None:
        """Log again the records up to the checkpoint (or the takeover), from the metrics files
        of the peers that held the trackers then, into a W&B run that could not be continued:
        W&B resumes no offline run (its resumed run is a new offline run with the same id,
        starting at step 0, and `wandb sync` keeps one of the two), so the newest offline run
        holds the whole history, each step once."""
        if self.run_dir is None or self.step is None:
            return
        bounds = [after for after, _ in self.holders[1:]] + [self.step]
        for (after, holder), last in zip(self.holders, bounds):
            for record in _records(self.run_dir, holder, after, min(last, self.step)):
                self.write(record_scalars(shareable(record, self.private)), record["step"])

    @staticmethod
    def _tags(origin: Dict[str, Any]) -> List[str]:
        """W&B tags (64 characters at most each) from the provenance."""
        tags = [f"backend:{origin.get('backend')}", f"peers:{origin.get('world_size')}"]
        if origin.get("git_commit"):
            tags.append(f"commit:{origin['git_commit'][:12]}")
        if origin.get("git_dirty"):
            tags.append("uncommitted-changes")
        return tags

    def write(self, scalars, step):
        if scalars:
            self.run.log(scalars, step=step)

    def finish(self, summary):
        if summary is not None:
            self.run.summary.update(summary_scalars(summary))
            base = str(self.run_dir.resolve().parent) if self.run_dir is not None else None
            for path in self.run_files():  # under <run name>/: W&B keeps its own config.yaml
                self.run.save(str(path.resolve()), base_path=base, policy="now")
        self.run.finish(exit_code=0 if summary is not None else 1)

    def release(self):
        self.run.finish(exit_code=0)


class MLflowTracker(Tracker):
    """Options: ``experiment`` and ``tracking_uri`` (see the module docstring)."""

    name = "mlflow"
    package = TRACKER_PACKAGES["mlflow"]

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

        uri, artifacts = self.options.get("tracking_uri"), None
        if uri is None:  # the run directory's own database, and its artifacts beside it
            uri = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
            artifacts = (run_dir / "mlflow-artifacts").resolve().as_uri()
        elif str(uri).startswith("file:") or "://" not in str(uri):  # a file store: opt in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        for chatty in ("mlflow.store.db.utils", "alembic"):  # its schema set-up, at INFO
            logging.getLogger(chatty).setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=str(uri))
        if self.run_id is not None:  # resumed: the same run, running again
            self.client.update_run(self.run_id, status="RUNNING")
            for key in self.client.get_run(self.run_id).data.metrics:  # an earlier attempt's
                kind, history = key.split("/")[0], self.client.get_metric_history(self.run_id, key)
                self.logged[kind] = max([self.logged.get(kind, -1), *(m.step for m in history)])
            return
        name = self.options.get("experiment", "gossip_powersgd")
        found = self.client.get_experiment_by_name(name)
        experiment = (
            found.experiment_id if found else self.client.create_experiment(name, artifacts)
        )
        tags = {k: v[:5000] for k, v in provenance_tags(self.provenance).items()}
        if self.provenance.get("git_commit"):
            tags["mlflow.source.git.commit"] = self.provenance["git_commit"]
        if run_dir is not None:
            tags["run_dir"] = str(run_dir.resolve())
        self.run_id = self.client.create_run(
            experiment, run_name=self.run_name(), tags=tags
        ).info.run_id
        for key, value in context.config.to_dict().items():
            self.client.log_param(self.run_id, key, str(value)[:500])

    def write(self, scalars, step):
        for key, value in scalars.items():
            self.client.log_metric(self.run_id, key, value, step=step)

    def finish(self, summary):
        if summary is not None:
            step = int(summary.get("steps", 0))
            self.write(summary_scalars(summary), step)
        for path in self.run_files():
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED" if summary is not None else "FAILED")


TRACKERS = {t.name: t for t in (TensorBoardTracker, WandbTracker, MLflowTracker)}


__all__ = [
    "Tracker",
    "TRACKERS",
    "TensorBoardTracker",
    "WandbTracker",
    "MLflowTracker",
    "provenance_tags",
    "RUN_FILES",
]
