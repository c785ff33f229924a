"""Checkpoints a resume must refuse in our own words: one renamed to the newest epoch, a pickled
one, garbage (torch's advice never quoted), and --resume with another out_dir (a full disk at a
checkpoint: tests/training/test_session.py)."""

import hashlib
import io
import os
import pickle
import shutil

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.trainer import train
from tests.conftest import cli, no_space_for, one_error
from tests.conftest import errors_on_every_rank as every_rank
from tests.conftest import tiny_config as tiny
from tests.privacy.test_view_files import unblock_later
from tests.privacy.test_views_reliability import interrupt_in_epoch_3, resumable


class _Foreign:
    """Any class: a file holding it is a pickle of Python objects, not of tensors."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A finished 2-epoch tiny run: every rank holds epochs 1 and 2."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert every_rank(tiny(f"out_dir={out}", "epochs=2")) == ["ok"] * 4
    return out


def copy_run(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    return out


def test_an_older_checkpoint_renamed_to_the_newest_epoch_is_named(reference, tmp_path):
    out = copy_run(reference, tmp_path)
    newest = ckpt.checkpoint_path(out, 2, 2)
    shutil.copyfile(ckpt.checkpoint_path(out, 2, 1), newest)
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True))
    assert error == (
        f"ValueError: checkpoint {newest} holds epoch 1 (step 13), not epoch 2 as its "
        "name says: it was renamed or copied over; restore the right file, or delete "
        "it to resume from the previous epoch"
    )
    newest.unlink()  # as the message says: the run resumes from epoch 1
    assert every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True) == ["ok"] * 4


def _pickled(kind):
    buffer = io.BytesIO()
    if kind == "plain pickle":
        pickle.dump({"header": _Foreign()}, buffer)
    else:
        torch.save({"header": _Foreign()}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["torch file", "plain pickle", "payload"])
def test_a_pickled_checkpoint_is_refused_in_our_own_words(reference, tmp_path, kind):
    out = copy_run(reference, tmp_path)
    path = ckpt.checkpoint_path(out, 1, 2)
    if kind == "payload":  # a valid header and digest around a pickled payload
        payload = _pickled("torch file")
        record = torch.load(path, weights_only=True)
        record["payload"] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        record["sha256"] = hashlib.sha256(payload).hexdigest()
        torch.save(record, path)
    else:
        path.write_bytes(_pickled(kind))
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True))
    what = {
        "torch file": "the file holds pickled Python objects",
        "plain pickle": "the file is a pickle, not torch's zip format",
        "payload": "its payload holds pickled Python objects",
    }[kind]
    assert error == (
        f"ValueError: checkpoint {path} is not a weights-only checkpoint of this "
        f"project: {what}, which is never loaded; it was not written by gossip_powersgd "
        "(or was replaced): restore the file, or delete it to resume from the previous "
        "epoch"
    )


def test_garbage_is_still_corrupt_and_torch_advice_is_never_quoted(reference, tmp_path):
    out = copy_run(reference, tmp_path)
    path = ckpt.checkpoint_path(out, 1, 2)
    path.write_bytes(b"not a checkpoint at all" * 10)
    with pytest.raises(ValueError) as info:
        ckpt.read_checkpoint(path)
    assert (
        str(info.value)
        == f"checkpoint {path} is corrupt or truncated (the file is not a torch file)"
    )


def test_resume_after_a_full_disk_at_the_first_checkpoint_gives_the_real_reason(
    tmp_path, monkeypatch
):
    out = tmp_path / "run"
    no_space_for(monkeypatch, ckpt, "rank-1-epoch-1.pt")
    assert "No space left on device" in one_error(every_rank(tiny(f"out_dir={out}", "epochs=2")))
    monkeypatch.undo()
    assert [ckpt.available_epochs(out, k) for k in range(4)] == [[1], [], [1], [1]]
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True))
    assert error == (
        f"ValueError: cannot resume {out}: {out / 'checkpoints'} has checkpoint files "
        "for rank(s) 0,2-3 but rank(s) 1 have none, so some files are missing or "
        "incomplete, most likely from an interrupted write (a full disk or a job killed "
        "while writing its first checkpoint); no epoch can be resumed on every rank: "
        "restore the missing files, or start the run again"
    )


def test_resume_with_another_out_dir_is_refused(reference, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    code, lines = cli(["--resume", reference, "--set", f"out_dir={elsewhere}"], capsys)
    assert code != 0 and lines == [
        f"error: --resume {reference} continues the run in {reference}, so --set out_dir="
        f"{elsewhere} would be ignored: drop --set out_dir (or copy the run directory there and "
        "--resume that copy)"
    ]
    assert not elsewhere.exists()


def test_a_fifo_in_place_of_a_checkpoint_is_refused_on_every_rank(tmp_path):
    out = tmp_path / "run"
    interrupt_in_epoch_3(resumable(out))
    path = ckpt.checkpoint_path(out, 2, 2)
    path.unlink()
    os.mkfifo(path)
    unblock_later(path)

    def peer(comm):
        try:
            train(comm, resumable(out), resume=True)
        except ValueError as exc:
            return str(exc)
        return "trained"

    lines = LocalCluster(topologies.ring(4), timeout=60).run(peer)  # hung in open() before
    assert set(lines) == {
        f"checkpoint {path} is a FIFO (named pipe), not a regular file: "
        "replace it with the file itself"
    }


def _train(config, resume=False, stop_at=None):
    """Every peer's summary; `stop_at`: the step at which the run is interrupted (RuntimeError)."""

    def on_step(step):
        if step == stop_at:
            raise RuntimeError(f"interrupted at step {step}")

    cluster = LocalCluster(topologies.parse(config.topology), timeout=30)
    return cluster.run(train, config, resume=resume, on_step=on_step)


def test_a_second_interruption_after_a_resume_still_leaves_an_epoch_every_rank_holds(tmp_path):
    """A resumed run drops each rank's files newer than the epoch it resumed from: kept, rank 0's
    stale epoch-4 file stayed among its two newest and pruned the epoch-2 file that was the only
    one every rank still held after a second interruption (no epoch could be resumed)."""
    out = tmp_path / "run"

    def config(every):  # how often a run checkpoints may change on resume
        return tiny(f"out_dir={out}", "epochs=4", f"checkpoint_every={every}")

    finished = _train(config(2))
    ckpt.checkpoint_path(out, 1, 4).unlink()  # rank 1 was killed before writing epoch 4
    for name in ("summary.json", "summary.md"):
        (out / name).unlink()
    with pytest.raises(RuntimeError, match="interrupted at step 40"):
        _train(config(1), resume=True, stop_at=3 * 13 + 1)  # resumed at 2, wrote 3, then killed
    assert [ckpt.available_epochs(out, k) for k in range(4)] == [[2, 3]] * 4
    ckpt.checkpoint_path(out, 1, 3).unlink()  # as if rank 1 had been killed before writing 3
    resumed = _train(config(1), resume=True)  # from epoch 2, the newest every rank holds
    assert [s["model_sha256"] for s in resumed] == [s["model_sha256"] for s in finished]
