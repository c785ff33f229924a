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


def _check_spec(key, saved, current, data=None):
    """check_header of a config whose `key` was `saved` at the checkpoint and is `current` now."""

    def config(value):
        return json.dumps({"lr": 0.1, "epochs": 4, key: value})

    run = expected(config_json=config(current), **({"data": data} if data else {}))
    saved_header = header(config_hash="hash of the text", config=config(saved))
    if data:
        saved_header["data"] = {k.replace(current, saved): v for k, v in data.items()}
    check_header("f.pt", saved_header, **run)


@pytest.mark.parametrize(
    "key, saved, current",
    [
        ("dataset", "synthetic_logreg:d=20,classes=4", "synthetic_logreg:classes=4,d=20"),
        ("dataset", "synthetic_logreg:d=20", "SYNTHETIC_LOGREG:d=020,noise=0.1,test=0.2"),
        ("partition", "dirichlet:0.5", "dirichlet:alpha=0.50"),
        ("partition", "shards:k=2", "shards:2"),
        ("model", "cnn1d", "cnn1d:channels=32"),
        ("model", "vgg16:width=64,bn=true", "VGG16:bn=yes"),
        ("model", "mlp:8,8", "MLP:8, 8"),
        ("topology", "ring:4", "RING:4"),
        ("topology", "ring", "ring:4"),  # a spec without a size takes the run's 4 peers
        ("churn", "rate=0.02,down=50", "down=50,rate=0.020,seed=0"),
        ("churn", "leave:3@200,join:3@400", "leave:3@200, join:3@0400"),
    ],
)
def test_a_spec_spelled_otherwise_but_meaning_the_same_resumes(key, saved, current):
    _check_spec(key, saved, current)


@pytest.mark.parametrize(
    "key, saved, current",
    [
        ("dataset", "synthetic_logreg:d=20,classes=4", "synthetic_logreg:classes=4,d=21"),
        ("dataset", "gone_dataset", "synthetic_logreg:d=20"),  # a spec this version cannot parse
        ("partition", "dirichlet:0.5", "dirichlet:alpha=0.6"),
        ("partition", "iid", "contiguous"),
        ("model", "mlp:8", "mlp:9"),
        ("model", "cnn1d", "cnn1d:channels=16"),
        ("topology", "complete:4", "ring:4"),
        ("topology", "ring", "ring:5"),  # a spec of another size than the run's never passes
        ("churn", "leave:3@200", "leave:3@201"),
        ("churn", "rate=0.02,down=50", "rate=0.02,down=50,seed=1"),
    ],
)
def test_a_spec_that_means_another_run_is_refused_naming_its_key(key, saved, current):
    with pytest.raises(ValueError) as info:
        _check_spec(key, saved, current)
    assert str(info.value) == (
        f"checkpoint f.pt was written with another config: {key} {saved!r} -> {current!r}"
    )


def test_a_real_change_beside_a_respelled_spec_names_the_change_only():
    saved = {"lr": 0.3, "epochs": 4, "dataset": "synthetic_logreg:d=20", "model": "MLP:8"}
    current = {
        "lr": 0.1,
        "epochs": 4,
        "dataset": "synthetic_logreg:d=20,classes=10",
        "model": "mlp:8",
    }
    run = expected(config_json=json.dumps(current))
    with pytest.raises(ValueError) as info:
        check_header("f.pt", header(config_hash="x", config=json.dumps(saved)), **run)
    assert str(info.value) == "checkpoint f.pt was written with another config: lr 0.3 -> 0.1"


def test_in_memory_data_named_by_a_respelled_dataset_spec_is_still_compared_by_its_bytes():
    saved, current = "synthetic_logreg:d=20,classes=4", "synthetic_logreg:classes=4,d=20"
    name = f"the data of dataset spec {current!r}"
    _check_spec("dataset", saved, current, data={name: "d" * 64})
    run = expected(config_json=json.dumps({"dataset": current}), data={name: "e" * 64})
    then = header(config=json.dumps({"dataset": saved}), config_hash="x")
    then["data"] = {f"the data of dataset spec {saved!r}": "d" * 64}
    with pytest.raises(ValueError) as info:
        check_header("f.pt", then, **run)
    assert str(info.value) == (
        f"checkpoint f.pt was written with other data: {name} has changed since the checkpoint "
        "(sha256 dddddddddddd... then, eeeeeeeeeeee... now); resume with the data the run was "
        "started with, or start a new run"
    )
