"""A peer's record of its private releases (`privacy.releases`): where it lives, what a new process
of the peer reads from it, and what it adds to the accountant. The runs that use it (a kill and a
resume, attempts set aside) are in test_training.py."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gossip_powersgd.privacy.dpsgd import DPSGD
from gossip_powersgd.privacy.releases import ReleaseRecord, count_earlier, record_path

pytest.importorskip("opacus")


def test_the_record_is_written_whole_beside_the_checkpoints_and_is_the_peers_own(tmp_path):
    record = ReleaseRecord(tmp_path, 2)
    assert record.path == tmp_path / "checkpoints" / "rank-2-dp-releases.json"
    assert record.read() is None
    record.write([(1.0, 0.25, 3), (2.0, 0.25, 1)])
    assert record.read() == [(1.0, 0.25, 3), (2.0, 0.25, 1)]
    assert stat.S_IMODE(os.stat(record.path).st_mode) == 0o600
    assert os.listdir(record.path.parent) == [record.path.name]  # no temporary file left


def test_a_killed_writers_temporary_record_is_removed_by_the_next_process_of_the_peer(tmp_path):
    """The record is rewritten at every private step: a kill lands in atomic_write's window
    sooner or later and leaves `.rank-K-dp-releases.json.XXXXXXXX.tmp` (a stale history, never
    read), which stayed in checkpoints/ for good. The peer's next process removes its own at its
    first write; another peer's (that peer may be writing it) stays."""
    from tests.test_utils import killed_while_writing

    ReleaseRecord(tmp_path, 2).write([(1.0, 0.25, 3)])
    killed_while_writing(record_path(tmp_path, 2))
    theirs = killed_while_writing(record_path(tmp_path, 1))
    record = ReleaseRecord(tmp_path, 2)  # the resumed process
    record.write([(1.0, 0.25, 4)])
    assert sorted(os.listdir(record.path.parent)) == sorted([record.path.name, theirs.name])
    assert record.read() == [(1.0, 0.25, 4)]


def test_a_new_attempt_reads_the_record_of_the_newest_attempt_set_aside_that_holds_one(tmp_path):
    record = ReleaseRecord(tmp_path, 1)
    assert record.earlier() == []
    attempts = tmp_path / "failed-attempts"
    ReleaseRecord(attempts / "1", 1).write([(1.0, 0.5, 4)])
    ReleaseRecord(attempts / "2", 1).write([(1.0, 0.5, 4), (2.0, 0.5, 5)])  # 1's, then its own
    ReleaseRecord(attempts / "2", 0).write([(1.0, 0.5, 99)])  # another peer's
    (attempts / "3").mkdir()  # an attempt that ended before its first private step
    (attempts / "notes").mkdir()  # not an attempt
    assert record.earlier() == [(1.0, 0.5, 4), (2.0, 0.5, 5)]


def test_a_damaged_record_is_a_one_line_error_naming_it(tmp_path):
    path = record_path(tmp_path, 0)
    path.parent.mkdir()
    path.write_text(json.dumps({"history": [[1.0, 0.5]]}))
    with pytest.raises(ValueError, match="rank-0-dp-releases.json is damaged") as error:
        ReleaseRecord(tmp_path, 0).read()
    assert "\n" not in str(error.value)


def test_only_releases_beyond_the_history_are_counted_and_said(capsys):
    dp = DPSGD(1.0, 1.0, 0.5, 4)
    dp.accountant.history = [(1.0, 0.5, 5)]
    assert count_earlier(dp, [(1.0, 0.5, 5)], 3, "after the checkpoint") == 0
    assert count_earlier(dp, [], 3, "after the checkpoint") == 0
    assert (dp.steps, dp.earlier_releases, capsys.readouterr().err) == (5, 0, "")
    assert count_earlier(dp, [(1.0, 0.5, 5), (2.0, 0.5, 2)], 3, "after the checkpoint") == 2
    assert dp.accountant.history == [(1.0, 0.5, 5), (2.0, 0.5, 2)]
    assert (dp.steps, dp.earlier_releases, dp.own_steps) == (7, 2, 5)
    assert capsys.readouterr().err == (
        "dp (rank 3): 2 private steps released after the checkpoint are counted in its epsilon "
        "(their noise was secret and is drawn anew)\n"
    )
