"""Trackers carry the run's provenance and its summary, under the documented names.

Each tracker's files are read back with the tracker's own reader (TensorBoard's event accumulator,
the MLflow client and `mlflow.search_runs` on its SQLite store, the records of W&B's offline run
file), from a run of `gossip-train` itself: its run name is the run directory's, its tags say the
commit, whether the checkout had changes, the versions, the backend, the number of peers and the
command line that started it; config.yaml and summary.json go with it; every number is named
``eval/<key>``, ``log/<key>`` or ``summary/<key>`` (`metric_names`), equal to the run's files; a run
that fails ends its tracker's run as failed.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gossip_powersgd.training.metric_names import ACCURACY_KEYS, RECORD_KEYS, summary_scalars
from gossip_powersgd.training.provenance import library_versions, source_checkout
from tests.training.test_trackers import rank0_records, run_local, tiny, wandb_items, wandb_records

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
LOGGERS = (
    "loggers=[tensorboard, {wandb: {mode: offline, project: tiny}}, {mlflow: {experiment: tiny}}]"
)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A gossip-train run with all three trackers: (run directory, its summary, rank 0's records)."""
    out = tmp_path_factory.mktemp("tracked") / "my-study-run"
    command = [sys.executable, "-m", "gossip_powersgd.cli.train", "--config", str(TINY)]
    command += ["--quiet", "--set", "epochs=2", "--set", "log_every=5"]
    command += ["--set", f"out_dir={out}", "--set", LOGGERS]
    env = dict(os.environ, WANDB_SILENT="true", OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    return out, summary, rank0_records(out)


def test_the_recorded_command_is_the_command_line_that_started_the_run(tracked):
    _, summary, _ = tracked
    origin = summary["provenance"]
    assert origin["launcher"] is None
    assert origin["command"][:3] == [sys.executable, "-m", "gossip_powersgd.cli.train"]
    assert origin["command"][-1] == LOGGERS  # each argument as the OS passed it


def test_mlflow_run_has_the_run_name_provenance_tags_artifacts_and_summary(tracked):
    import mlflow
    from mlflow.tracking import MlflowClient

    out, summary, records = tracked
    uri = f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.run_name == "my-study-run" and run.info.status == "FINISHED"
    tags, origin = run.data.tags, summary["provenance"]
    checkout = source_checkout()
    assert tags["git_commit"] == (checkout["git_commit"] or "not a git checkout")
    assert tags["mlflow.source.git.commit"] == checkout["git_commit"]
    assert tags["git_dirty"] == str(checkout["git_dirty"]).lower()
    assert tags["torch"] == library_versions()["torch"]
    assert (tags["backend"], tags["world_size"], tags["launcher"]) == ("local", "4", "none")
    assert tags["command"].startswith(f"{sys.executable} -m gossip_powersgd.cli.train --config")
    assert tags["command"] == shlex.join(origin["command"])
    assert run.data.params["topology"] == "ring:4"
    # config.yaml and summary.json as artifacts, byte for byte
    names = sorted(a.path for a in client.list_artifacts(run.info.run_id))
    assert names == ["config.yaml", "summary.json", "summary.md"]
    for name in ("config.yaml", "summary.json"):
        copy = Path(client.download_artifacts(run.info.run_id, name, str(out.parent)))
        assert copy.read_bytes() == (out / name).read_bytes()
    # every metric under a documented name, the final ones equal to the run's files
    metrics = run.data.metrics
    assert all(name.split("/")[0] in ("eval", "log", "summary") for name in metrics)
    assert all(name.split("/", 1)[1] in RECORD_KEYS for name in metrics if "summary/" not in name)
    assert metrics["summary/final_test_acc_avg_model"] == summary["final_test_acc_avg_model"]
    assert metrics["eval/test_acc_avg_model"] == records[-1]["test_acc_avg_model"]
    # the pandas view (mlflow-skinny needs pandas for it: the tracking extra installs it)
    mlflow.set_tracking_uri(uri)
    frame = mlflow.search_runs(experiment_names=["tiny"])
    assert list(frame["tags.mlflow.runName"]) == ["my-study-run"]
    assert list(frame["metrics.summary/mb_sent_per_peer"]) == [summary["mb_sent_per_peer"]]


def test_tensorboard_holds_hparams_with_the_final_metrics_and_the_provenance(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    out, summary, _ = tracked
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    plugin = {
        tag: plugin_data_pb2.HParamsPluginData.FromString(raw)
        for tag, raw in events.PluginTagToContent("hparams").items()
    }
    start = plugin["_hparams_/session_start_info"].session_start_info
    assert start.hparams["topology"].string_value == "ring:4"
    assert start.hparams["epochs"].number_value == 2
    experiment = plugin["_hparams_/experiment"].experiment
    names = {m.name.tag for m in experiment.metric_infos}
    assert names == set(summary_scalars(summary))
    (final,) = events.Scalars("summary/final_test_acc_avg_model")
    assert final.step == summary["steps"]
    assert final.value == pytest.approx(summary["final_test_acc_avg_model"], rel=2.0**-24)
    (text,) = events.Tensors("provenance/text_summary")
    shown = text.tensor_proto.string_val[0].decode()
    # as TensorBoard's Text tab shows it: the markdown table rendered by its own function
    from tensorboard.plugin_util import markdown_to_safe_html

    html_table = markdown_to_safe_html(shown)
    cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", html_table, re.S)]
    shown_as = dict(zip(cells[::2], cells[1::2]))
    assert shown_as["command"] == shlex.join(summary["provenance"]["command"])
    assert shown_as["backend"] == "local"


def test_wandb_run_has_the_name_tags_notes_config_summary_and_files(tracked):
    out, summary, _ = tracked
    (path,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(path)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    origin = summary["provenance"]
    assert run.display_name == "my-study-run"
    commit = origin["git_commit"]
    expected = ["backend:local", "peers:4"] + ([f"commit:{commit[:12]}"] if commit else [])
    assert list(run.tags)[: len(expected)] == expected
    assert ("uncommitted-changes" in run.tags) == bool(origin["git_dirty"])
    assert run.notes.startswith(f"{sys.executable} -m gossip_powersgd.cli.train")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["topology"] == "ring:4" and config["provenance"]["world_size"] == 4
    last = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            last.update(wandb_items(record.summary.update))
    assert last["summary/final_test_acc_avg_model"] == summary["final_test_acc_avg_model"]
    saved = {
        f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files
    }
    assert {"my-study-run/config.yaml", "my-study-run/summary.json"} <= saved
    copy = path.parent / "files" / "my-study-run" / "summary.json"
    assert json.loads(copy.read_text()) == summary
    (end,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 0


class _Stop(Exception):
    pass


def _stop(step):
    if step == 3:
        raise _Stop(step)


def test_a_failed_run_ends_its_tracker_runs_as_failed(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_SILENT", "true")
    config = tiny(tmp_path, loggers=["mlflow", {"wandb": {"mode": "offline"}}])
    with pytest.raises(_Stop):
        run_local(config, on_step=_stop)
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(config.out_dir) / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("gossip_powersgd").experiment_id])
    assert run.info.status == "FAILED"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["config.yaml"]
    assert not any(name.startswith("summary/") for name in run.data.metrics)
    (path,) = (Path(config.out_dir) / "wandb").glob("offline-run-*/run-*.wandb")
    (end,) = [r.exit for r in wandb_records(path) if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 1


def test_every_record_key_is_in_the_naming_table_and_accuracies_are_fractions(tracked, tmp_path):
    _, _, records = tracked
    dp = tiny(
        tmp_path,
        dp_noise_multiplier=1.0,
        dp_max_grad_norm=1.0,
        release_peer_statistics=True,
        log_every=5,
    )
    private = tiny(tmp_path / "private", dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, log_every=5)
    run_local(dp)
    run_local(private)
    for run in (dp, private):
        records = records + rank0_records(Path(run.out_dir))
    keys = {k for r in records for k in r} - {"kind", "model_sha256"}
    assert keys <= set(RECORD_KEYS), sorted(keys - set(RECORD_KEYS))
    assert {"epsilon", "delta", "epsilon_max", "train_loss", "train_loss_local"} <= keys
    accuracies = [r[k] for r in records for k in ACCURACY_KEYS if k in r]
    assert accuracies and all(0.0 <= a <= 1.0 for a in accuracies)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/usr/bin/mpiexec", "-n", "8", "python", "-m", "m"], ("mpiexec", 0)),
        (["mpirun", "-np", "4", "python", "x.py"], ("mpiexec", 0)),
        (["srun", "-n", "2", "python", "x.py"], ("srun", 0)),
        (
            ["/v/bin/python3", "/v/bin/torchrun", "--nproc-per-node", "8", "-m", "m"],
            ("torchrun", 1),
        ),
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2"], ("torchrun", 0)),
        (["/usr/bin/hydra_pmi_proxy", "--control-port", "vm:1"], None),
        (["python", "-m", "gossip_powersgd.cli.train"], None),
    ],
)
def test_a_launcher_is_told_by_its_command_line(argv, expected):
    from gossip_powersgd.training.provenance import _launcher_line

    found = _launcher_line(argv)
    assert found == (None if expected is None else (expected[0], argv[expected[1] :]))


def test_a_launcher_out_of_sight_is_said_so(monkeypatch):
    """Under a launcher whose process this one cannot see (another host), the command is this
    process's own, and a note says so."""
    from gossip_powersgd.training import provenance

    own = ["/v/bin/python", "-m", "gossip_powersgd.cli.train", "--config", "demo"]
    monkeypatch.setattr(provenance, "_cmdline", lambda pid: own if pid == "self" else None)
    monkeypatch.setenv("PMI_RANK", "3")
    found = provenance.launch_command()
    assert found["command"] == own and found["launcher"] == "mpiexec"
    assert "cannot see" in found["command_note"]
    monkeypatch.delenv("PMI_RANK")
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MPI_LOCALNRANKS", raising=False)
    assert provenance.launch_command() == {"command": own, "launcher": None}


def test_the_provenance_comments_keep_config_yaml_yaml_whatever_the_command_holds():
    """A `python -c` program's line breaks, a terminal escape and an argument that was not valid
    UTF-8 (a lone surrogate, as Python decodes it) stay on the command's one comment line, escaped:
    the comments parse as no YAML at all and the file can be written as UTF-8."""
    import yaml

    from gossip_powersgd.training.provenance import as_comments

    command = ["python", "-c", "import a\nrun()\r\n", "\x1b[1m", "caf\udce9", "\u2028", "tab\there"]
    record = dict(gossip_powersgd="0", git_commit="abc", git_dirty=False, python="3.11")
    record.update(libraries={"torch": "2"}, command=command, backend="local", world_size=1)
    record["peers_per_host"] = {"h": 1}
    text = as_comments(record)
    lines = text.encode("utf-8").decode("utf-8").splitlines()
    assert len(lines) == 4 and all(line.startswith("# ") for line in lines)
    assert "\\nrun()\\r\\n" in lines[2] and "\\x1b[1m" in lines[2] and "caf\\udce9" in lines[2]
    assert "\\u2028" in lines[2] and "tab\\there" in lines[2]
    assert yaml.safe_load(text + "a: 1\n") == {"a": 1}
