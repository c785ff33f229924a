"""Experiment trackers (`loggers:`) and user hooks (`hooks:`) named in the config.

Each tracker's own reader reads back what a real run wrote: TensorBoard's event accumulator, the
MLflow client on its SQLite store, W&B's offline run files. The values must equal rank 0's metric
records (the same float64 numbers; TensorBoard stores scalars as float32, so they are compared at
float32 rounding, a relative 2^-24).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training.config import TrainConfig, load_config, validate_config
from gossip_powersgd.training.hooks import TrainingHooks
from gossip_powersgd.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
FLOAT32 = 2.0**-24


def tiny(tmp_path, **changes) -> TrainConfig:
    config = load_config(TINY, deep=False).replace(
        epochs=1, quiet=True, out_dir=str(tmp_path / "run")
    )
    return config.replace(**changes)


def run_local(config: TrainConfig, **kwargs):
    return LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config, **kwargs)


def rank0_records(run_dir: Path):
    lines = (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_tensorboard_event_file_holds_the_eval_metrics_and_the_step_losses(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny(tmp_path, loggers=["tensorboard"], log_every=3)
    run_local(config)
    records = rank0_records(Path(config.out_dir))
    events = EventAccumulator(str(Path(config.out_dir) / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    logs = [r for r in records if r["kind"] == "log"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert (
        logs
        and evals
        and {
            "log/train_loss",
            "eval/test_acc_avg_model",
            "eval/consensus_distance",
            "eval/train_loss",
        }
        <= tags
    )
    got = [(e.step, e.value) for e in events.Scalars("log/train_loss")]
    assert [s for s, _ in got] == [r["step"] for r in logs]
    for (_, value), record in zip(got, logs):
        assert value == pytest.approx(record["train_loss"], rel=FLOAT32)
    (final,) = events.Scalars("eval/test_acc_avg_model")
    assert final.step == evals[-1]["step"]
    assert final.value == pytest.approx(evals[-1]["test_acc_avg_model"], rel=FLOAT32)


def test_mlflow_store_holds_the_metrics_and_a_resumed_run_continues_its_run(tmp_path):
    from mlflow.tracking import MlflowClient

    config = tiny(tmp_path, loggers=[{"mlflow": {"experiment": "tiny"}}], epochs=2, log_every=3)
    steps_per_epoch = run_local(config.replace(out_dir=None, loggers=[]))[0]["steps_per_epoch"]
    with pytest.raises(_Interrupt):  # in epoch 2, after the epoch-1 checkpoint
        run_local(config, on_step=_stop_at(steps_per_epoch + 2))
    run_local(config, resume=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(config.out_dir) / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    (run,) = client.search_runs([experiment.experiment_id])  # one run across the resume
    assert run.data.params["topology"] == "ring:4"
    evals = [r for r in rank0_records(Path(config.out_dir)) if r["kind"] == "eval"]
    history = client.get_metric_history(run.info.run_id, "eval/test_acc_avg_model")
    assert [(m.step, m.value) for m in history] == [
        (r["step"], r["test_acc_avg_model"]) for r in evals
    ]
    assert len(evals) == 2
    # the log record at step steps_per_epoch + 2, written before the interruption and again by
    # the resumed run, is in the MLflow run once (it was twice), as in the metrics file
    logs = [r["step"] for r in rank0_records(Path(config.out_dir)) if r["kind"] == "log"]
    history = client.get_metric_history(run.info.run_id, "log/train_loss")
    assert sorted(m.step for m in history) == logs and steps_per_epoch + 2 in logs


def test_a_resumed_run_shows_each_tensorboard_step_once(tmp_path):
    """The records written after the checkpoint, before the run was interrupted, are purged from
    TensorBoard's view (`purge_step`) when the resumed run writes them again (they showed twice:
    two points at one step). TensorBoard's own reader reads both event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny(tmp_path, loggers=["tensorboard"], epochs=2, log_every=3)
    steps_per_epoch = run_local(config.replace(out_dir=None, loggers=[]))[0]["steps_per_epoch"]
    with pytest.raises(_Interrupt):  # in epoch 2, after the epoch-1 checkpoint
        run_local(config, on_step=_stop_at(steps_per_epoch + 2))
    run_local(config, resume=True)
    folder = Path(config.out_dir) / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # one per attempt
    events = EventAccumulator(str(folder))
    events.Reload()
    records = rank0_records(Path(config.out_dir))
    for kind in ("log", "eval"):
        steps = [e.step for e in events.Scalars(f"{kind}/train_loss")]
        assert steps == [r["step"] for r in records if r["kind"] == kind], kind
    assert steps_per_epoch + 2 in [r["step"] for r in records if r["kind"] == "log"]


def test_a_continued_tensorboard_file_sorts_after_the_files_it_continues(tmp_path):
    """TensorBoard reads a log dir's event files in name order: second, host, pid, then a count of
    the process's writers in decimal. A resumed (or taken over) run in the same process and second
    as the file before it could sort first ("10" before "9": the suite's earlier writers decide),
    and be read before the events it purges. Here the earlier file is of this second from host
    "~" (after any host name): the continued writer's file must still sort after it."""
    import time

    from gossip_powersgd.training.trackers import TensorBoardTracker

    folder = tmp_path / "tensorboard"
    folder.mkdir()
    earlier = folder / f"events.out.tfevents.{int(time.time()):010d}.~.1.9"
    earlier.write_bytes(b"")
    tracker = TensorBoardTracker()
    tracker.continuing, tracker.step, tracker.provenance = True, 5, {}
    tracker.open(None, tmp_path)
    tracker.writer.close()
    names = sorted(p.name for p in folder.iterdir())
    assert names[0] == earlier.name and len(names) == 2, names


def test_a_resumed_run_whose_checkpoint_follows_no_record_shows_each_tensorboard_step_once(
    tmp_path,
):
    """A checkpoint before the run's first record (eval_every 2, checkpoint_every 1, a log record
    every steps_per_epoch + 7 steps) held no last step, and the resumed run then purged nothing:
    the log record written after that checkpoint, before the interruption, showed twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps_per_epoch = run_local(tiny(tmp_path, out_dir=None))[0]["steps_per_epoch"]
    config = tiny(
        tmp_path, loggers=["tensorboard"], epochs=3, eval_every=2, log_every=steps_per_epoch + 7
    )
    with pytest.raises(_Interrupt):  # in epoch 2, after the epoch-1 checkpoint and a log record
        run_local(config, on_step=_stop_at(steps_per_epoch + 9))
    run_local(config, resume=True)
    events = EventAccumulator(str(Path(config.out_dir) / "tensorboard"))
    events.Reload()
    records = rank0_records(Path(config.out_dir))
    for kind in ("log", "eval"):
        steps = [e.step for e in events.Scalars(f"{kind}/train_loss")]
        assert steps == [r["step"] for r in records if r["kind"] == kind], kind
    assert events.Tensors("provenance/text_summary")  # step 0's text is kept


class _Interrupt(Exception):
    pass


def _stop_at(step_count: int):
    def on_step(step):
        if step == step_count:
            raise _Interrupt(step)

    return on_step


#: How long `wandb_records` waits for a finished run's exit record to reach its file.
WANDB_FLUSH_SECONDS = 60.0


def wandb_records(path: Path):
    """The protobuf `Record`s of a finished offline W&B run file, once its exit record is there.

    wandb's service, a process of its own, writes the file; `run.finish()` returns when the
    service has taken the exit, which can be before its writer has flushed the file (seen under
    pytest-xdist on a loaded machine). So this polls the file until the exit record appears, up to
    WANDB_FLUSH_SECONDS, then returns what is there (a test then fails on what is missing)."""
    import time

    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + WANDB_FLUSH_SECONDS
    while True:
        try:  # a record being written reads as a truncated chunk: read the file again
            records = _wandb_file_records(path)
        except (AssertionError, DecodeError):
            if time.monotonic() > deadline:
                raise
        else:
            if any(r.WhichOneof("record_type") == "exit" for r in records):
                return records
            if time.monotonic() > deadline:
                return records
        time.sleep(0.1)


def _wandb_file_records(path: Path):
    """The protobuf `Record`s of an offline W&B run file (run-*.wandb): wandb's datastore writes a
    7-byte file header (":W&B", a magic number, a version), then the LevelDB log format: 32 KiB
    blocks of chunks, each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle,
    4 last), a block's tail under 7 bytes left as padding; each record is a protobuf `Record`."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, chunks, pending = 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            chunks.append(pending)
    records = []
    for raw in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def wandb_items(items):
    """{key: value} of W&B's history or summary items ("a/b" keys may arrive nested)."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def wandb_history(path: Path):
    """The history rows of an offline W&B run file."""
    return [
        wandb_items(r.history.item)
        for r in wandb_records(path)
        if r.WhichOneof("record_type") == "history"
    ]


def test_wandb_offline_run_holds_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = tiny(tmp_path, loggers=[{"wandb": {"mode": "offline", "project": "tiny"}}])
    run_local(config)
    records = rank0_records(Path(config.out_dir))
    (path,) = (Path(config.out_dir) / "wandb").glob("offline-run-*/run-*.wandb")
    rows = wandb_history(path)
    logs = [r for r in records if r["kind"] == "log"]
    assert [(row["_step"], row["log/train_loss"]) for row in rows if "log/train_loss" in row] == [
        (r["step"], r["train_loss"]) for r in logs
    ]
    (final,) = [row for row in rows if "eval/test_acc_avg_model" in row]
    assert final["eval/test_acc_avg_model"] == records[-1]["test_acc_avg_model"]
    assert final["_step"] == records[-1]["step"]


def test_a_resumed_offline_wandb_run_holds_every_step_once(tmp_path, monkeypatch):
    """W&B resumes no offline run: the resumed run's wandb.init starts a new offline run with the
    same id at step 0 (`resumed` False), and `wandb sync` keeps one of the two. The tracker logs
    the records up to the checkpoint again into it, so that the newest offline run holds rank 0's
    whole history, each step once (it held only the steps after the checkpoint)."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = tiny(tmp_path, loggers=[{"wandb": {"mode": "offline"}}], epochs=2, log_every=3)
    steps_per_epoch = run_local(config.replace(out_dir=None, loggers=[]))[0]["steps_per_epoch"]
    with pytest.raises(_Interrupt):  # in epoch 2, after the epoch-1 checkpoint
        run_local(config, on_step=_stop_at(steps_per_epoch + 5))
    run_local(config, resume=True)
    files = (Path(config.out_dir) / "wandb").glob("offline-run-*/run-*.wandb")
    newest = max(files, key=lambda path: path.stat().st_mtime_ns)
    rows = wandb_history(newest)
    records = rank0_records(Path(config.out_dir))
    assert [row["_step"] for row in rows] == [r["step"] for r in records]  # steps rise: once each
    for row, record in zip(rows, records):
        assert row[f"{record['kind']}/train_loss"] == record["train_loss"]
    assert steps_per_epoch in [r["step"] for r in records]  # the checkpoint's eval, logged again


class Recorder(TrainingHooks):
    """Writes what its hook points saw to a JSON file (per rank), for the CLI test below."""

    def __init__(self, path: str, tag: str = ""):
        self.path, self.tag, self.seen = path, tag, {"losses": [], "records": []}

    def setup(self, context):
        self.rank = context.comm.rank

    def after_step(self, step, loss):
        self.seen["losses"].append([step, loss])

    def on_record(self, record):
        self.seen["records"].append(record["kind"])

    def close(self):
        Path(f"{self.path}.{self.rank}").write_text(json.dumps(dict(self.seen, tag=self.tag)))


def test_a_hooks_entry_runs_a_user_hook_from_gossip_train(tmp_path):
    module = tmp_path / "my_hooks.py"
    module.write_text(
        textwrap.dedent("""
        from tests.training.test_trackers import Recorder as R

        class Recorder(R):
            pass
    """)
    )
    out = tmp_path / "seen"
    entry = json.dumps([{"my_hooks:Recorder": {"path": str(out), "tag": "from-cli"}}])
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [
                str(tmp_path),
                str(ROOT),
                str(ROOT / "tests" / "support"),
                os.environ.get("PYTHONPATH", ""),
            ]
        ),
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gossip_powersgd.cli.train",
            "--config",
            str(TINY),
            "--quiet",
            "--set",
            "epochs=1",
            "--set",
            f"out_dir={tmp_path / 'run'}",
            "--set",
            f"hooks={entry}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for rank in range(4):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        assert seen["tag"] == "from-cli"
        assert [s for s, _ in seen["losses"]] == list(range(summary["steps"]))
        assert all(isinstance(loss, float) for _, loss in seen["losses"])
        assert seen["records"].count("eval") == 1 and "log" in seen["records"]


def test_a_tracker_needs_a_place_to_write(tmp_path):
    config = tiny(tmp_path, loggers=["tensorboard"], out_dir=None)
    with pytest.raises(ValueError, match="tensorboard needs a run directory"):
        run_local(config)


# ---- Reliability IV: tracker options are the tracker's own, and trackers open at start -------------


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"tensorboard": {"flush_secs_typo": 3}},
            "loggers: tensorboard has no option 'flush_secs_typo' (did you mean 'flush_secs'?)",
        ),
        (
            {"tensorboard": {"logdir": "x"}},
            "loggers: tensorboard has no option 'logdir' (did you mean 'log_dir'?)",
        ),
        (
            {"mlflow": {"experimnet": "typo"}},
            "loggers: mlflow has no option 'experimnet' (did you mean 'experiment'?)",
        ),
        (
            {"wandb": {"projetc": "x"}},
            "loggers: wandb has no option 'projetc' (did you mean 'project'?)",
        ),
        ({"wandb": {"dri": "x"}}, "loggers: wandb has no option 'dri' (did you mean 'dir'?)"),
        ({"wandb": {"config": {}}}, "loggers: wandb has no option 'config'"),
    ],
)
def test_a_tracker_option_it_does_not_take_is_a_one_line_error(entry, message):
    with pytest.raises(ValueError) as info:
        validate_config(TrainConfig(loggers=[entry]), deep=False)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value) and "its options:" in str(info.value)


def test_tensorboard_takes_summary_writers_options(tmp_path):
    logdir = tmp_path / "elsewhere"
    config = tiny(
        tmp_path,
        loggers=[{"tensorboard": {"log_dir": str(logdir), "filename_suffix": ".mine"}}],
    )
    run_local(config)
    assert [p.name.endswith(".mine") for p in logdir.iterdir()] == [True]
    assert not (Path(config.out_dir) / "tensorboard").exists()


def test_a_wandb_dir_it_cannot_write_fails_at_start_not_in_the_temp_folder(tmp_path, monkeypatch):
    """W&B falls back to the system temp folder when its dir is not writable: refused instead, at
    set-up (before any step), on every rank, in one line."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    steps = []
    config = tiny(tmp_path, loggers=[{"wandb": {"mode": "offline", "dir": str(blocker / "wandb")}}])
    with pytest.raises(ValueError) as info:
        run_local(config, on_step=steps.append)
    assert steps == []  # at start, not at the first record
    assert str(info.value).startswith(f"loggers: wandb cannot write to its dir {blocker / 'wandb'}")
    assert "system temp folder" in str(info.value)


def test_mlflow_keeps_its_runs_in_sqlite_and_takes_an_explicit_file_uri(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    config = tiny(tmp_path, loggers=[{"mlflow": {"experiment": "tiny"}}])
    run_local(config)
    database = Path(config.out_dir) / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.data.metrics["eval/test_acc_avg_model"] > 0.25
    store = (tmp_path / "file-store").resolve().as_uri()
    explicit = tiny(tmp_path / "b", loggers=[{"mlflow": {"tracking_uri": store}}])
    run_local(explicit)  # MLflow 3's file store needs an opt-in, which an explicit URI gives
    assert (tmp_path / "file-store").is_dir()


def test_the_provenance_table_keeps_every_value_in_its_cell():
    """TensorBoard's provenance text is a markdown table: a command with line breaks and a `|`
    (a `python -c` program) stays one row, its two cells intact."""
    from gossip_powersgd.training.trackers import provenance_table

    tags = {"command": "python -c 'import a\nprint(1 | 2)'", "backend": "local"}
    lines = provenance_table(tags).splitlines()
    assert lines[:2] == ["| | |", "|---|---|"] and len(lines) == 4
    assert lines[2] == "| command | python -c 'import a\\\\nprint(1 \\| 2)' |"
    assert lines[3] == "| backend | local |"


@pytest.mark.parametrize(
    "value",
    [
        "python -c 'print(1 \\| 2)'",  # a backslash before a `|` ended the cell there
        "C:\\runs\\",  # a backslash at the end escaped the cell's closing `|`
        "--set out_dir=runs/my_run_1 *x* [l](u) `c` ![i](u)",  # emphasis, links, code
        "a & b &amp; <b>bold</b> a<b",  # entities and tags shown as typed
        "import a\nprint('é')",  # a line break (escaped, `utils.escaped`), not ASCII
    ],
)
def test_tensorboard_shows_each_provenance_value_as_written(value):
    """Rendered by TensorBoard's own markdown (`plugin_util.markdown_to_safe_html`, what its Text
    tab shows), each value is its cell's whole text, character for character (`utils.escaped`'s
    one-line form): no markup of markdown or HTML in a command line is read as such."""
    import html
    import re

    from tensorboard.plugin_util import markdown_to_safe_html

    from gossip_powersgd.training.trackers import provenance_table
    from gossip_powersgd.utils import escaped

    shown = markdown_to_safe_html(provenance_table({"command": value, "backend": "local"}))
    cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", shown, re.S)]
    assert cells == ["command", escaped(value), "backend", "local"], shown
