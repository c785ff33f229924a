"""The run directory (training/rundir.py): one run at a time holds its lock (a stale lock of an
ended process, a zombie or a reused pid is replaced, another host's never), an unusable out_dir is
one line on every rank; and `--resume auto`: a relaunch of the very same command continues the run
(torchrun --max-restarts, a requeued batch job). A user hook named in the config fails once at a
chosen step; the relaunched command must end with the same model, bit for bit, as a run that never
failed (resume is bit-exact), and a failure before the first checkpoint starts the run again without
losing the first attempt's files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import ps_state

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.hooks import TrainingHooks
from gossip_powersgd.training.trainer import train
from tests.conftest import ROOT, TINY, cli, tiny_config
from tests.conftest import errors_on_every_rank as every_rank


class FailOnce(TrainingHooks):
    """Raises at `step` unless `marker` exists; creates it first (so a relaunch passes)."""

    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, Path(marker)

    def after_step(self, step, loss):
        if step == self.step and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError(f"injected failure at step {step}")


def command(run_dir: Path, fail_at: int, marker: Path):
    hook = json.dumps(
        [{"tests.training.test_rundir:FailOnce": {"step": fail_at, "marker": str(marker)}}]
    )
    return [
        sys.executable,
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        str(TINY),
        "--quiet",
        "--set",
        "epochs=2",
        "--set",
        f"out_dir={run_dir}",
        "--set",
        f"hooks={hook}",
        "--resume",
        "auto",
    ]


def launch(args):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize(
    "fail_at, lost",
    [(16, []), (2, []), (16, [1, 2, 3])],
    ids=["after-a-checkpoint", "before-any-checkpoint", "killed-writing-the-first-checkpoint"],
)
def test_a_relaunch_of_the_same_command_continues_the_run(tmp_path, fail_at, lost):
    """`lost`: ranks whose epoch-1 checkpoint is removed after the failure, as if the job had been
    killed while they wrote it: no epoch is held by every rank, so the attempt has no complete
    checkpoint and is set aside like one that failed before any (explicit --resume refuses it,
    test_resume.py); every relaunch used to refuse it, naming the ranks without one."""
    # the same config (hooks are part of it) with the marker already there: it never fails
    (tmp_path / "never").touch()
    reference = launch(command(tmp_path / "reference", fail_at, tmp_path / "never"))
    assert reference.returncode == 0, reference.stderr
    expected = json.loads((tmp_path / "reference" / "summary.json").read_text())
    assert expected["steps_per_epoch"] == 13  # step 16 is in epoch 2, after the epoch-1 checkpoint

    args = command(tmp_path / "run", fail_at, tmp_path / "marker")
    first = launch(args)
    assert first.returncode != 0 and f"injected failure at step {fail_at}" in first.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    for rank in lost:
        ckpt.checkpoint_path(tmp_path / "run", rank, 1).unlink()
    second = launch(args)  # the very same command
    assert second.returncode == 0, second.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model_sha256"] == expected["model_sha256"]
    assert summary["steps"] == expected["steps"] == 26
    attempts = tmp_path / "run" / "failed-attempts"
    if fail_at < expected["steps_per_epoch"] or lost:  # started again, the files kept
        assert (attempts / "1" / "metrics" / "rank-0.jsonl").is_file()
        assert ckpt.available_epochs(attempts / "1", 0) == ([1] if lost else [])
        assert "ended before its first complete checkpoint" in second.stderr
    else:
        assert not attempts.exists()

    # the metrics file holds every step once, as the reference's does
    def steps(run):
        lines = (tmp_path / run / "metrics" / "rank-0.jsonl").read_text().splitlines()
        return [json.loads(line)["step"] for line in lines]

    assert steps("run") == steps("reference")


def test_resume_auto_needs_a_config_to_start_from(tmp_path):
    result = launch([sys.executable, "-m", "gossip_powersgd.cli.train", "--resume", "auto"])
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --resume auto needs --config FILE or a RUN_DIR holding config.yaml"
    )
    result = launch([sys.executable, "-m", "gossip_powersgd.cli.train", "--resume", "a", "b"])
    assert result.returncode != 0 and "--resume takes RUN_DIR or auto [RUN_DIR]" in result.stderr


def test_a_second_run_in_the_same_run_directory_fails_at_once_naming_the_holder(tmp_path):
    """Bad input 14: while one run trains, another into its directory fails with one line."""
    out = tmp_path / "run"
    config = tiny_config(f"out_dir={out}")
    second = {}

    def start_a_second_run(step):
        if step == 2 and "error" not in second:
            second["error"] = "no error"
            try:
                LocalCluster(topologies.parse(config.topology), timeout=30).run(train, config)
            except ValueError as exc:
                second["error"] = str(exc)

    def peer(comm):
        return train(comm, config, on_step=start_a_second_run if comm.rank == 0 else None)

    summaries = LocalCluster(topologies.parse(config.topology), timeout=60).run(peer)
    assert second["error"] == (
        f"run directory {out} is in use by another run (pid {os.getpid()} on "
        f"host {socket.gethostname()} holds {out / '.lock'}); wait for it to "
        "end or choose another out_dir (delete the lock file only if that "
        "run is gone)"
    )
    assert summaries[0]["epochs_done"] == config.epochs
    assert json.loads((out / "summary.json").read_text())["steps"] == summaries[0]["steps"]
    lines = (out / "metrics" / "rank-0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == sorted(
        json.loads(l)["step"] for l in lines
    )
    assert not (out / ".lock").exists()  # released at the end


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_stale_lock_of_an_ended_process_is_replaced_with_a_note(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid()}))
    assert every_rank(tiny_config(f"out_dir={out}", "epochs=1")) == ["ok"] * 4
    err = capsys.readouterr().err
    assert "note: replaced the stale lock" in err and "(that process has ended)" in err
    assert not (out / ".lock").exists() and (out / "summary.json").exists()


def _own_start_time() -> int:
    """This process's start time, in clock ticks since boot (proc(5): field 22 of stat)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process states are read from /proc")
def test_a_lock_of_a_zombie_or_of_a_pid_now_another_process_s_is_stale(tmp_path):
    """A rank that ended with its supervisor (hydra kills both) is a zombie until init reaps it,
    which may be after mpiexec returned: it holds nothing, and `--resume` at once takes its lock.
    Nor does a pid that is now another process's (the start time differs) hold one; a lock of
    this very process (pid and start time) does."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # never waited for: a zombie
    deadline = time.monotonic() + 60
    while ps_state(zombie.pid) != "Z":
        assert time.monotonic() < deadline, ps_state(zombie.pid)
        time.sleep(0.02)
    host, me, start = socket.gethostname(), os.getpid(), _own_start_time()
    holders = {
        "zombie": {"host": host, "pid": zombie.pid, "start": None},
        "reused": {"host": host, "pid": me, "start": start - 1},
        "no start time, as before": {"host": host, "pid": zombie.pid},
    }
    try:
        for name, holder in holders.items():
            out = tmp_path / name
            out.mkdir()
            (out / ".lock").write_text(json.dumps(holder))
            lock = ckpt.take_run_lock(out, create=False)
            assert lock.note and f"of pid {holder['pid']} on {host}" in lock.note, name
            assert json.loads((out / ".lock").read_text()) == {
                "host": host,
                "pid": me,
                "start": start,
            }
            lock.release()
    finally:
        zombie.wait()
    out = tmp_path / "live"
    out.mkdir()
    (out / ".lock").write_text(json.dumps({"host": host, "pid": me, "start": start}))
    with pytest.raises(ValueError, match=f"is in use by another run \\(pid {me} on host"):
        ckpt.take_run_lock(out, create=False)


def test_a_lock_of_another_host_is_never_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": dead_pid()}))
    errors = every_rank(tiny_config(f"out_dir={out}", "epochs=1"))
    assert len(set(errors)) == 1 and "on host elsewhere holds" in errors[0], errors
    assert [p.name for p in out.iterdir()] == [".lock"]


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    out = tmp_path / "run"
    errors = every_rank(tiny_config(f"out_dir={out}", "lr=1e9"))
    assert all("diverged" in e for e in errors), errors
    assert out.is_dir() and not (out / ".lock").exists()
    # nothing written yet: a failure at set-up leaves no directory at all
    errors = every_rank(
        tiny_config(f"out_dir={tmp_path / 'other'}", "model=reliability_fixtures:meta_net")
    )
    assert all("meta device" in e for e in errors) and not (tmp_path / "other").exists()


def test_resume_takes_the_lock_too(tmp_path):
    out = tmp_path / "run"
    assert every_rank(tiny_config(f"out_dir={out}", "epochs=1")) == ["ok"] * 4
    (out / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    errors = every_rank(tiny_config(f"out_dir={out}", "epochs=2"), resume=True)
    assert len(set(errors)) == 1 and "is in use by another run" in errors[0], errors


@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_an_unusable_out_dir_is_one_line_on_every_rank(tmp_path, where):
    if where == "under-a-file":
        (tmp_path / "file").write_text("")
        out, reason = tmp_path / "file" / "run", "Not a directory"
    else:
        # tests run as root, who may write anywhere chmod forbids; not even root creates in /sys
        out, reason = "/sys/gossip_powersgd_run", "Operation not permitted"
    errors = every_rank(tiny_config(f"out_dir={out}"))
    assert set(errors) == {
        f"ValueError: cannot create run directory {out}: {reason}; choose a "
        "writable out_dir (--set out_dir=...)"
    }


@pytest.mark.parametrize(
    "setting, words",
    [
        (
            "out_dir=",
            "--set out_dir= gives no value: give one (out_dir=DIR), or out_dir=null for its "
            "default",
        ),
        ("out_dir=runs/a\nb", "bad value for 'out_dir': 'runs/a\\nb' (a line break or control"),
    ],
)
def test_an_empty_or_multi_line_out_dir_is_refused(tmp_path, capsys, monkeypatch, setting, words):
    """`out_dir=` used to become runs/<config name> without a word, and a line break in it a
    space (YAML folds a multi-line plain scalar)."""
    monkeypatch.chdir(tmp_path)
    code, lines = cli(["--config", TINY, "--set", setting], capsys)
    assert code != 0 and len(lines) == 1 and lines[0].startswith(f"error: {words}"), lines
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("resume", ["yes", "Auto", "", 1.0, None])
def test_a_resume_that_is_not_true_false_or_auto_is_refused_in_one_line(tmp_path, resume):
    """run(..., resume="yes") was taken as resume=True (any string but "auto"), so a typo of
    "auto" resumed, and failed on a run with no checkpoint, naming something else."""
    from gossip_powersgd import run

    config = dict(
        topology="ring:2",
        dataset="synthetic_logreg:d=4,classes=2,n=64",
        model="logreg",
        epochs=1,
        out_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ValueError, match=f"resume must be True, False or 'auto', got {resume!r}"):
        run(config, resume=resume)
    assert not (tmp_path / "run").exists()
