"""training/resume.py: which epoch the ranks resume from and whether a checkpoint belongs to the
resuming run, each refusal one line naming the file. (Resuming through the trainer — bit-exact
continuation, refused runs, damaged files — is tests/training/test_checkpoint.py and
test_checkpoint_inputs.py, which share one reference run.)"""

from __future__ import annotations

import json

import pytest

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.resume import (
    agree_resume_epoch,
    auto_resumes,
    check_header,
    describe_config_diff,
    latest_common_epoch,
    load_for_resume,
)

RING = topologies.ring(4)
CONFIG = json.dumps({"lr": 0.1, "epochs": 4})


def expected(**changes):
    """What a resuming rank 1 of a ring:4 run checks a header against."""
    run = dict(
        rank=1,
        world_size=4,
        topology=RING,
        topology_spec="ring:4",
        config_hash="abc",
        config_json=CONFIG,
        data={"train.bin": "d" * 64},
    )
    run.update(changes)
    return run


def header(**changes):
    return ckpt.make_header(**expected(), epoch=2, step=20) | changes


def test_the_newest_epoch_every_rank_holds_is_the_common_one():
    assert latest_common_epoch([[1, 2, 3], [1, 2], [2, 3]]) == 2
    assert latest_common_epoch([[1], [2]]) is None
    assert latest_common_epoch([]) is None


def test_a_config_difference_names_each_changed_added_and_removed_key():
    saved = json.dumps({"lr": 0.1, "epochs": 4, "gone": 1})
    current = json.dumps({"lr": 0.3, "epochs": 4, "new": True})
    assert describe_config_diff(saved, current) == (
        "gone 1 -> '<absent>'; lr 0.1 -> 0.3; new '<absent>' -> True"
    )
    assert describe_config_diff("{not json", current) == "its recorded config is unreadable"
    assert describe_config_diff(current, current) == "(hash differs)"


def test_a_header_of_this_run_passes():
    check_header("f.pt", header(), **expected())


@pytest.mark.parametrize(
    "changes, run, message",
    [
        ({"world_size": 2}, {}, "f.pt was written by a run of 2 peers; this run has 4"),
        (
            {},
            {"topology": topologies.parse("complete:4"), "topology_spec": "complete:4"},
            "f.pt is for topology 'ring:4' (another mixing matrix); this run uses 'complete:4'",
        ),
        ({"rank": 2}, {}, "f.pt belongs to rank 2, not rank 1"),
        (
            {"config_hash": "other", "config": json.dumps({"lr": 0.2, "epochs": 4})},
            {},
            "f.pt was written with another config: lr 0.2 -> 0.1",
        ),
        ({"data": {"train.bin": "e" * 64}}, {}, "train.bin has changed since the checkpoint"),
        ({}, {"data": {}}, "train.bin is gone"),
    ],
)
def test_a_header_of_another_run_is_refused_in_one_line_naming_the_file(changes, run, message):
    with pytest.raises(ValueError) as info:
        check_header("f.pt", header(**changes), **expected(**run))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_file_holding_another_epoch_than_its_name_says_is_refused(tmp_path):
    ckpt.save_checkpoint(tmp_path, header(), {"x": 1})
    assert load_for_resume(tmp_path, 2, **expected())["header"]["epoch"] == 2
    ckpt.checkpoint_path(tmp_path, 1, 2).rename(ckpt.checkpoint_path(tmp_path, 1, 3))
    with pytest.raises(ValueError, match=r"holds epoch 2 \(step 20\), not epoch 3"):
        load_for_resume(tmp_path, 3, **expected())


def _agree(run_dir):
    """Every rank's answer (or its error's text) on a ring:4 run in `run_dir`."""

    def peer(comm):
        try:
            return agree_resume_epoch(comm, run_dir)
        except ValueError as exc:
            return str(exc)

    return LocalCluster(RING).run(peer)


def test_the_ranks_agree_on_the_newest_epoch_all_hold_or_name_the_ranks_without_one(tmp_path):
    folder = ckpt.checkpoint_dir(tmp_path)
    folder.mkdir()
    for rank, epochs in enumerate([[1, 2, 3], [2, 3], [2, 3], [2]]):
        for epoch in epochs:  # only the names count here: the files are read after agreeing
            ckpt.checkpoint_path(tmp_path, rank, epoch).touch()
    assert _agree(tmp_path) == [2, 2, 2, 2]
    ckpt.checkpoint_path(tmp_path, 3, 2).unlink()  # rank 3 now holds none
    errors = _agree(tmp_path)
    assert len(set(errors)) == 1 and "\n" not in errors[0]
    assert "has checkpoint files for rank(s) 0-2 but rank(s) 3 have none" in errors[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    # the line says how to go on: it named the missing folder only
    assert set(_agree(empty)) == {
        f"cannot resume {empty}: no checkpoint in {empty / 'checkpoints'} (the run ended "
        "before its first checkpoint, or checkpoint_every is 0); start it again with --resume "
        f"auto {empty} (from Python: run(..., resume='auto')), which sets its files aside first"
    }


def test_resume_auto_starts_again_unless_an_epoch_is_held_by_every_rank(tmp_path):
    """`resume=AUTO`: files on some ranks only (a job killed while writing its first checkpoint)
    are an attempt to set aside and start again (False on every rank), where an explicit resume
    refuses them (above); files of a run of another size are refused as an explicit resume does."""

    def auto(run_dir):
        def peer(comm):
            try:
                return auto_resumes(comm, run_dir, ckpt.available_epochs(run_dir, comm.rank))
            except ValueError as exc:
                return str(exc)

        return LocalCluster(RING).run(peer)

    assert auto(tmp_path / "missing") == [False] * 4
    for rank in range(4):
        ckpt.save_checkpoint(tmp_path, header(rank=rank, epoch=1), {"x": 1})
    assert auto(tmp_path) == [True] * 4
    for rank in (1, 2, 3):
        ckpt.checkpoint_path(tmp_path, rank, 1).unlink()
    assert auto(tmp_path) == [False] * 4
    ckpt.save_checkpoint(tmp_path, header(rank=1, epoch=1, world_size=2), {"x": 1})
    assert set(auto(tmp_path)) == {
        f"cannot resume {tmp_path}: its checkpoints were written by a run of 2 peers; this "
        "run has 4: resume with 2 peers"
    }


def _config_header(algorithm, **more):
    config = {"lr": 0.1, "epochs": 4, "algorithm": algorithm, **more}
    return header(config_hash="hash of the text", config=json.dumps(config))


@pytest.mark.parametrize(
    "saved, current",
    [
        ("powergossip:rank=1,iters=1", "powergossip:iters=1,rank=1"),  # another order
        ("powergossip:rank=1", "powergossip:rank=1,iters=1,warm=yes,gamma=none"),  # defaults
        ("POWERGOSSIP:rank=1", "powergossip:rank=01"),
        ("choco:compressor=[randomk:0.1],gamma=0.4", "choco:gamma=0.40,compressor=randomk:0.1"),
    ],
)
def test_an_algorithm_spec_spelled_otherwise_but_meaning_the_same_resumes(saved, current):
    run = expected(config_json=json.dumps({"lr": 0.1, "epochs": 4, "algorithm": current}))
    check_header("f.pt", _config_header(saved), **run)


@pytest.mark.parametrize(
    "saved, current, more, message",
    [
        (
            "powergossip:rank=1",
            "powergossip:rank=2",
            {},
            "'powergossip:rank=1' -> 'powergossip:rank=2'",
        ),
        ("powergossip:rank=1", "powergossip:rank=1,iters=2", {}, "-> 'powergossip:rank=1,iters=2'"),
        ("powergossip:rank=1", "powersgd:rank=1", {}, "-> 'powersgd:rank=1'"),
        ("powergossip:rank=1,iters=1", "powergossip:iters=1,rank=1", {"lr": 0.3}, "lr 0.3 -> 0.1"),
        ("gone:x=1", "powergossip:rank=1", {}, "algorithm 'gone:x=1' -> 'powergossip:rank=1'"),
    ],
)
def test_an_algorithm_spec_that_means_another_run_is_still_refused(saved, current, more, message):
    run = expected(config_json=json.dumps({"lr": 0.1, "epochs": 4, "algorithm": current}))
    with pytest.raises(ValueError, match="f.pt was written with another config: ") as info:
        check_header("f.pt", _config_header(saved, **more), **run)
    assert message in str(info.value)
