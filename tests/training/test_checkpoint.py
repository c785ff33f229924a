"""Checkpoints: atomic files, bit-exact resume, and every way a checkpoint can be refused."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from processes import descendants, ending, ps_state, rank_pids

import topologies
from gossip_powersgd import (
    LocalCluster,
    utils,
)
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import TrainConfig, load_config
from gossip_powersgd.training.trainer import TIMING_KEYS, train
from gossip_powersgd.utils import atomic_write
from tests.conftest import (
    ROOT,
    SUPPORT,
    TINY,
    errors_on_every_rank,
    mpiexec_path,
)
from tests.privacy.test_views_reliability import interrupt_in_epoch_3, resumable, run_with_stats


class Interrupted(RuntimeError):
    pass


def config_for(out_dir, **changes) -> TrainConfig:
    # momentum, a cosine schedule with warm-up and log records make every piece of state matter
    base = load_config(TINY, deep=False).replace(
        out_dir=str(out_dir),
        quiet=True,
        momentum=0.9,
        lr=0.2,
        schedule="cosine",
        warmup_epochs=0.5,
        log_every=4,
        epochs=4,
        checkpoint_every=1,
    )
    return base.replace(**changes)


def run(config: TrainConfig, resume: bool = False, stop_at: int | None = None):
    def on_step(step):
        if stop_at is not None and step == stop_at:
            raise Interrupted(f"interrupted at step {step}")

    topology = topologies.parse(config.topology)
    return LocalCluster(topology, timeout=30).run(train, config, resume=resume, on_step=on_step)


def comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def read_jsonl(run_dir, rank):
    lines = (Path(run_dir) / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 4-epoch run (PowerGossip, SGD with momentum, cosine schedule)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    summaries = run(config_for(out))
    return out, summaries


@pytest.mark.parametrize(
    "algorithm, changes",
    [
        ("powergossip:rank=1", {}),
        ("powersgd:rank=1", {}),  # a gradient averager, with error feedback
        # uneven shards: the data iterators stand mid-pass at the checkpoint; Adam's state
        (
            "powergossip:rank=2",
            dict(
                optimizer="adam",
                momentum=0.0,
                lr=0.01,
                model="mlp:16,16",
                partition="dirichlet:0.3",
            ),
        ),
        # topologies that change every step: per-edge state and the schedule position
        ("powergossip:rank=1", dict(topology="matchings:4")),
        ("choco:compressor=sign,gamma=0.2", dict(topology="one_peer_exponential:4")),
        ("pushsum", dict(topology="directed_exponential:4")),
    ],
)
def test_resume_after_interruption_is_bit_exact(tmp_path, reference, algorithm, changes):
    ref_dir, ref = reference
    if algorithm != "powergossip:rank=1" or changes:  # its own uninterrupted reference
        ref_dir = tmp_path / "reference"
        ref = run(config_for(ref_dir, algorithm=algorithm, **changes))
    out = tmp_path / "run"
    config = config_for(out, algorithm=algorithm, **changes)
    steps_per_epoch = ref[0]["steps_per_epoch"]
    with pytest.raises(Interrupted):
        run(config, stop_at=2 * steps_per_epoch + 3)  # in epoch 3, after the epoch-2 checkpoint
    assert ckpt.available_epochs(out, 0) == [1, 2]
    assert not (out / "summary.json").exists()
    resumed = run(config, resume=True)
    for rank in range(4):
        assert resumed[rank]["model_sha256"] == ref[rank]["model_sha256"]
        assert comparable(resumed[rank]["history"]) == comparable(ref[rank]["history"])
        # the JSONL lost the records past the checkpoint, then got them again: no duplicates
        assert comparable(read_jsonl(out, rank)) == comparable(read_jsonl(ref_dir, rank))
    assert json.loads((out / "summary.json").read_text())["model_sha256"] == ref[0]["model_sha256"]


def test_resume_from_newest_epoch_all_ranks_hold(tmp_path, reference):
    """A job killed while only some ranks had written epoch E resumes from E-1."""
    ref_dir, ref = reference
    out = tmp_path / "run"
    import shutil

    shutil.copytree(ref_dir, out)
    for name in ("summary.json", "summary.md"):
        (out / name).unlink()
    ckpt.checkpoint_path(out, 2, 4).unlink()  # rank 2 died before writing epoch 4
    resumed = run(config_for(out), resume=True)
    assert [s["model_sha256"] for s in resumed] == [s["model_sha256"] for s in ref]
    assert comparable(read_jsonl(out, 0)) == comparable(read_jsonl(ref_dir, 0))


def test_checkpoint_file_is_plain_weights_only_torch(reference):
    ref_dir, _ = reference
    path = ckpt.checkpoint_path(ref_dir, 1, 4)
    record = torch.load(path, weights_only=True)
    header = record["header"]
    assert header["rank"] == 1 and header["world_size"] == 4 and header["epoch"] == 4
    assert header["topology"] == "ring:4"
    loaded = ckpt.read_checkpoint(path)
    state = loaded["state"]
    for key in ("model", "optimizer", "algorithm", "rng", "batches", "history", "stats", "step"):
        assert key in state
    assert state["stats"]["bytes_sent"] > 0
    assert not list(ckpt.checkpoint_dir(ref_dir).glob(".*tmp*"))  # no temporary files left
    assert ckpt.available_epochs(ref_dir, 1) == [3, 4]  # the two newest are kept


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = ckpt.rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "x" / "f.txt"
    atomic_write(path, "one")
    atomic_write(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["f.txt"]


def _copy_run(reference, tmp_path) -> Path:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    return out


@pytest.mark.parametrize(
    "change, topology, expected",
    [
        (
            dict(lr=0.3),
            None,
            r"rank-0-epoch-4\.pt was written with another config: lr 0\.2 -> 0\.3",
        ),
        (dict(epochs=6), None, r"another config: epochs 4 -> 6"),
        (
            dict(topology="complete:4"),
            None,
            r"rank-0-epoch-4\.pt is for topology 'ring:4' \(another mixing matrix\); this run uses 'complete:4'",
        ),
        (
            dict(topology="ring:2"),
            None,
            r"rank-0-epoch-4\.pt was written by a run of 4 peers; this run has 2",
        ),
        (
            dict(topology="ring:6"),
            None,
            r"its checkpoints were written by a run of 4 peers; this run "
            r"has 6: resume with 4 peers",
        ),
    ],
)
def test_resume_refuses_a_checkpoint_of_another_run(
    tmp_path, reference, change, topology, expected
):
    out = _copy_run(reference, tmp_path)
    with pytest.raises(ValueError, match=expected) as info:
        run(config_for(out, **change), resume=True)
    assert "\n" not in str(info.value)


def test_backend_keys_may_change_on_resume(tmp_path, reference):
    out = _copy_run(reference, tmp_path)
    ckpt.checkpoint_path(out, 0, 4).unlink()
    resumed = run(config_for(out, checkpoint_every=2, comm_timeout=20.0), resume=True)
    assert resumed[0]["model_sha256"] == reference[1][0]["model_sha256"]


def test_a_config_with_its_specs_spelled_otherwise_resumes_exactly(tmp_path, reference):
    # the reference's dataset, model and topology, written otherwise; its in-memory data's digest
    # is named by the dataset spec as written, and still matched
    out = _copy_run(reference, tmp_path)
    for rank in range(4):
        ckpt.checkpoint_path(out, rank, 4).unlink()
    respelled = dict(
        dataset="synthetic_logreg:n=2000,classes=4,d=20,noise=0.1",
        model="LOGREG",
        topology="RING:4",
    )
    resumed = run(config_for(out, **respelled), resume=True)
    assert [s["model_sha256"] for s in resumed] == [s["model_sha256"] for s in reference[1]]


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("truncate", r"rank-1-epoch-4\.pt is corrupt or truncated"),
        ("flip", r"rank-1-epoch-4\.pt is corrupt"),
        ("garbage", r"rank-1-epoch-4\.pt is corrupt or truncated"),
        ("empty", r"rank-1-epoch-4\.pt is corrupt or truncated"),
        ("foreign", r"rank-1-epoch-4\.pt is not a gossip_powersgd checkpoint"),
    ],
)
def test_corrupt_checkpoint_is_named_on_every_rank(tmp_path, reference, damage, expected):
    out = _copy_run(reference, tmp_path)
    path = ckpt.checkpoint_path(out, 1, 4)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":
        record = torch.load(path, weights_only=True)
        record["payload"][len(record["payload"]) // 2] ^= 0xFF
        torch.save(record, path)
    elif damage == "garbage":
        path.write_bytes(b"not a checkpoint at all" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"model": torch.zeros(3)}, path)
    with pytest.raises(ValueError, match=expected) as info:
        run(config_for(out), resume=True)
    assert "\n" not in str(info.value)
    # the same message on every peer: collectively() shares the failing rank's line
    from gossip_powersgd.training.trainer import collectively

    messages = []

    def peer(comm):
        try:
            collectively(comm, ckpt.read_checkpoint, ckpt.checkpoint_path(out, comm.rank, 4))
        except ValueError as exc:
            messages.append(str(exc))

    LocalCluster(topologies.parse("ring:4")).run(peer)
    assert len(messages) == 4 and len(set(messages)) == 1 and "rank-1-epoch-4.pt" in messages[0]


def test_resume_without_checkpoints_or_directory(tmp_path):
    with pytest.raises(ValueError, match="no such run directory"):
        run(config_for(tmp_path / "missing"), resume=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no checkpoint in"):
        run(config_for(tmp_path / "empty"), resume=True)


# ---- Reliability IV: a resumed run reads the data it was started with --------------------------------


def _flip_a_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "dataset, model, changed",
    [
        ("cifar10", "logreg", "test_batch.bin"),
        ("cifar10", "logreg", "data_batch_5.bin"),
        # another word in the training text: another vocabulary
        ("wikitext2", "lstm_lm:layers=1,hidden=4", "wiki.train.tokens"),
    ],
)
def test_resume_refuses_data_changed_since_the_checkpoint_naming_the_file(
    tmp_path, dataset, model, changed
):
    import paper_fixtures

    from gossip_powersgd.training.data import clear_dataset_cache

    data = tmp_path / "data"
    if dataset == "cifar10":
        folder, spec = paper_fixtures.write_cifar10(data), f"cifar10:root={data}"
    else:
        folder, spec = paper_fixtures.write_wikitext2(data), f"wikitext2:root={data},bptt=4"
    config = config_for(
        tmp_path / "run",
        topology="ring:2",
        dataset=spec,
        model=model,
        partition="contiguous" if dataset == "wikitext2" else "iid",
        epochs=1,
        batch_size=8,
        lr=0.05,
        log_every=0,
        schedule="constant",
        warmup_epochs=0,
    )
    clear_dataset_cache()
    run(config)
    if changed == "wiki.train.tokens":
        text = (folder / changed).read_text().replace("game", "play", 1)
        (folder / changed).write_text(text)
    else:
        _flip_a_byte(folder / changed, 2000)
    clear_dataset_cache()
    errors = errors_on_every_rank(config, resume=True)
    clear_dataset_cache()
    assert len(set(errors)) == 1, errors
    assert f"{folder / changed} has changed since the checkpoint" in errors[0]
    assert "\n" not in errors[0]


EPOCHS = 16


@pytest.mark.mpi
@pytest.mark.timing
def test_a_rank_killed_mid_training_ends_the_job_and_the_run_resumes_exactly(tmp_path):
    """SIGKILL rank 2 of 4 after the epoch-1 checkpoints: the others exit within 30 s; any survivor
    that reports names rank 2; the newest checkpoint loads; --resume finishes with the model of an
    uninterrupted run.

    `-disable-auto-cleanup` asks hydra not to kill the survivors itself, so that they take our own
    comm_timeout path: logging and evaluation are off until the end, so the survivors wait in
    gossip exchanges, where a timeout names the silent neighbour (a timeout inside a collective
    names the operation, not the peer), and the peer's process found gone names it as killed.
    The hydra of mpich 5.0.2 kills them anyway, by SIGKILL within ~0.1 s and without a word (a
    three-rank job of plain sleepers, one killed, shows the same), so with it only rank 2's
    supervisor speaks; the neighbour named on a timeout is tested in tests/comm/test_mpi.py
    (test_mpi_silent_peer_ends_the_job_naming_it).
    Each rank's stderr goes to its own file: forwarded output races with the job's teardown."""
    out = tmp_path / "run"
    overrides = [
        "--set",
        f"epochs={EPOCHS}",
        "--set",
        "log_every=0",
        "--set",
        f"eval_every={EPOCHS}",
    ]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=f"{ROOT}{os.pathsep}{SUPPORT}",
    )
    command = [
        mpiexec_path(),
        "-disable-auto-cleanup",
        "-errfile-pattern",
        str(tmp_path / "stderr-%r.txt"),
        "-n",
        "4",
        sys.executable,
        "-m",
        "experiments.train",
        "--config",
        str(TINY),
        "--set",
        "backend=mpi",
        "--set",
        f"out_dir={out}",
        "--set",
        "comm_timeout=5",
        *overrides,
        "--quiet",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 150
        while not all(ckpt.checkpoint_path(out, r, 1).exists() for r in range(4)):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no epoch-1 checkpoint within 150 s"
            time.sleep(0.02)
        pids = rank_pids(process.pid)
        assert sorted(pids) == [0, 1, 2, 3], pids
        job = descendants(process.pid)  # hydra's proxy, the ranks' supervisors and the ranks
        os.kill(pids[2], signal.SIGKILL)
        killed = time.monotonic()
        output, _ = process.communicate(timeout=60)
        exit_seconds = time.monotonic() - killed
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    errors = "".join(p.read_text() for p in sorted(tmp_path.glob("stderr-*.txt")))
    print(
        f"other ranks gone {exit_seconds:.1f} s after the SIGKILL; exit {process.returncode}\n"
        f"{output[-1500:]}\n{errors}"
    )
    assert process.returncode != 0
    assert exit_seconds < 30
    # No process of the job outlives mpiexec: each is gone, a zombie left for init to reap, or
    # already ending (hydra kills a supervisor and its rank dies with it by SIGKILL, which a rank
    # holding torch's memory can still be carrying out in do_exit when mpiexec returns; the
    # orphan is reaped a moment later, and its run-directory lock is stale already: the --resume
    # below takes it over at once). A rank still running would be none of these.
    left = {pid: ps_state(pid) for pid in job if not ending(pid)}
    assert not left, f"still running after mpiexec ended (pid: state): {left}"
    # Rank 2's supervisor (its parent) names it, and the survivors name it, each finding its
    # process gone when a wait for it runs out (or hearing it from a rank that did).
    assert "error (rank 2): this rank's process" in errors, errors
    assert "was killed by signal 9 SIGKILL" in errors, errors
    timeouts = [line for line in errors.splitlines() if "no message from neighbour" in line]
    assert all("neighbour(s) [2] within 5 s" in line for line in timeouts), errors
    assert "Traceback" not in errors
    assert not (out / "summary.json").exists()

    # the newest checkpoint every rank holds loads
    epoch = max(set.intersection(*(set(ckpt.available_epochs(out, r)) for r in range(4))))
    assert 1 <= epoch < EPOCHS
    for rank in range(4):
        loaded = ckpt.read_checkpoint(ckpt.checkpoint_path(out, rank, epoch))
        assert loaded["header"]["epoch"] == epoch and loaded["header"]["rank"] == rank

    from experiments.train import run

    resumed = run(
        ["--resume", str(out), "--set", "backend=local", "--set", "comm_timeout=60", "--quiet"]
    )
    reference = run(
        ["--config", str(TINY), *overrides, "--set", f"out_dir={tmp_path / 'reference'}", "--quiet"]
    )
    assert resumed["steps"] == reference["steps"]
    assert resumed["model_sha256"] == reference["model_sha256"]
    assert (
        json.loads((out / "summary.json").read_text())["model_sha256"] == reference["model_sha256"]
    )


def test_ending_is_false_for_a_running_or_stopped_process_and_true_once_it_is_killed():
    """The check above: a process still running (or stopped) is not ending; the moment it is sent
    SIGKILL it is (a pending SIGKILL, do_exit, or already a zombie), and so once it is reaped."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not ending(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while ps_state(child.pid) != "T":
            assert time.monotonic() < deadline, ps_state(child.pid)
            time.sleep(0.001)
        assert not ending(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        assert ending(child.pid)
    finally:
        child.kill()
        child.wait()
    assert ending(child.pid)


def _header(epoch=1):
    return {"format": ckpt.FORMAT, "rank": 0, "epoch": epoch}


def test_a_write_failing_halfway_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = ckpt.save_checkpoint(tmp_path, _header(), {"value": torch.full((1000,), 1.0)})
    good = path.read_bytes()

    class HalfFile:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    # checkpoints are written by utils.atomic_write, through os.fdopen of its temporary file
    real_fdopen = utils.os.fdopen
    monkeypatch.setattr(utils.os, "fdopen", lambda fd, mode: HalfFile(real_fdopen(fd, mode)))
    with pytest.raises(OSError, match="No space left"):
        ckpt.save_checkpoint(tmp_path, _header(), {"value": torch.full((1000,), 2.0)})
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert torch.equal(ckpt.read_checkpoint(path)["state"]["value"], torch.full((1000,), 1.0))
    assert [p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir()] == [path.name]  # no temp left


WRITER = textwrap.dedent("""
    import sys, torch
    from gossip_powersgd.training import checkpoint as ckpt
    big = torch.zeros(2_000_000)
    for i in range(1, 10_000):
        big.fill_(i)
        ckpt.save_checkpoint(sys.argv[1], {"format": ckpt.FORMAT, "rank": 0, "epoch": 1},
                             {"i": i, "big": big})
        print(i, flush=True)
""")


def test_a_writer_killed_mid_write_never_leaves_a_half_file(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        for _ in range(2):  # two complete writes, then kill it somewhere in the third or fourth
            assert process.stdout.readline().strip(), "the writer died"
        time.sleep(random.uniform(0.0, 0.3))
        process.kill()
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    path = ckpt.checkpoint_path(tmp_path, 0, 1)
    state = ckpt.read_checkpoint(path)["state"]  # complete and verified (sha256)
    assert state["i"] >= 2 and torch.equal(
        state["big"], torch.full((2_000_000,), float(state["i"]))
    )
    assert ckpt.available_epochs(tmp_path, 0) == [1]  # a leftover temp file is never taken for one


def test_a_killed_writers_leftover_temporary_file_is_removed_by_the_next_save(tmp_path):
    from gossip_powersgd.training.checkpoint import checkpoint_dir, save_checkpoint

    folder = checkpoint_dir(tmp_path)
    folder.mkdir(parents=True)
    leftover = folder / ".rank-1-epoch-3.pt.tmp-999-1"  # named by earlier versions
    other_rank = folder / ".rank-2-epoch-3.pt.tmp-999-1"
    leftover_mkstemp = folder / ".rank-1-epoch-3.pt.k2j4_x9q.tmp"  # named by utils.atomic_write
    other_rank_mkstemp = folder / ".rank-2-epoch-3.pt.k2j4_x9q.tmp"
    for file in (leftover, other_rank, leftover_mkstemp, other_rank_mkstemp):
        file.write_bytes(b"half a checkpoint")
    path = save_checkpoint(tmp_path, {"rank": 1, "epoch": 4}, {"x": torch.zeros(2)})
    assert path.exists() and not leftover.exists() and not leftover_mkstemp.exists()
    assert other_rank.exists() and other_rank_mkstemp.exists()  # that rank's business


@pytest.mark.parametrize("topology", ["ring:4", "matchings:4"])
def test_resume_restores_every_traffic_counter(tmp_path, topology):
    reference = run_with_stats(resumable(tmp_path / "ref", f"topology={topology}"))
    config = resumable(tmp_path / "run", f"topology={topology}")
    interrupt_in_epoch_3(config)
    resumed = run_with_stats(config, resume=True)
    for (ref_summary, ref_stats), (summary, stats) in zip(reference, resumed):
        assert summary["model_sha256"] == ref_summary["model_sha256"]
        assert stats == ref_stats  # the whole CommStats: rounds and critical_bytes too
        assert stats.rounds > 0 and stats.critical_bytes > 0
    assert reference[0][0]["steps_per_epoch"] == 13  # what interrupt_in_epoch_3 assumes
