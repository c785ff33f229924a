"""training/churn_resume.py: a leaving peer's away file and which file each peer resumes from (whole
runs that leave, rejoin and resume: test_churn.py)."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training import churn_resume
from gossip_powersgd.training.churn_resume import away_path, away_steps, save_away

SPE = 13  # steps per epoch: epoch E's last step is 13 E - 1


class Membership:
    """Peer 1 away from step 10 to step 30 (back at 30), every other peer always a member."""

    def at(self, step):
        return {0, 2} if 10 <= step < 30 else {0, 1, 2}

    def absences(self, rank):
        return [(10, 30)] if rank == 1 else []


def header(rank, step):
    return {"format": ckpt.FORMAT, "rank": rank, "step": step}


def test_a_leaver_keeps_its_newest_away_files_only_and_others_are_untouched(tmp_path):
    for step in (5, 9, 20):
        save_away(tmp_path, header(1, step), {"x": torch.tensor([float(step)])})
    save_away(tmp_path, header(2, 3), {"x": torch.zeros(1)})
    (ckpt.checkpoint_dir(tmp_path) / "rank-1-away-notes.txt").write_text("not an away file")
    assert away_steps(tmp_path, 1) == [9, 20] and away_steps(tmp_path, 2) == [3]
    assert ckpt.KEEP == 2
    loaded = ckpt.read_checkpoint(away_path(tmp_path, 1, 20))
    assert loaded["header"] == header(1, 20) and float(loaded["state"]["x"]) == 20.0
    assert away_steps(tmp_path / "elsewhere", 1) == []


def test_a_leavers_next_away_file_removes_the_temporary_one_a_killed_writer_left(tmp_path):
    """As a checkpoint does: a peer killed while writing its away file left
    `.rank-K-away-S.pt.XXXXXXXX.tmp` (the size of its state) for good; its next away file removes
    it. Another peer's temporary files and checkpoints' own stay."""
    from tests.test_utils import killed_while_writing

    save_away(tmp_path, header(1, 5), {"x": torch.zeros(1)})
    killed_while_writing(away_path(tmp_path, 1, 9))
    kept = [killed_while_writing(away_path(tmp_path, 2, 9))]
    kept.append(killed_while_writing(ckpt.checkpoint_path(tmp_path, 1, 1)))
    save_away(tmp_path, header(1, 20), {"x": torch.ones(1)})
    names = {away_path(tmp_path, 1, s).name for s in (5, 20)} | {p.name for p in kept}
    assert set(p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir()) == names


def test_each_peer_resumes_from_its_checkpoint_or_from_the_absence_that_covers_the_epoch(tmp_path):
    """Epoch 1 ends at step 12, inside peer 1's absence (10..29): its away file of step 10;
    epoch 3 ends at step 38, after its return: its checkpoint of epoch 3."""
    membership = Membership()
    for path in (ckpt.checkpoint_path(tmp_path, 0, 1), away_path(tmp_path, 1, 10)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    assert churn_resume._source(tmp_path, 0, membership, 1, SPE) == ckpt.checkpoint_path(
        tmp_path, 0, 1
    )
    assert churn_resume._source(tmp_path, 1, membership, 1, SPE) == away_path(tmp_path, 1, 10)
    assert churn_resume._source(tmp_path, 1, membership, 2, SPE) == away_path(tmp_path, 1, 10)
    assert churn_resume._source(tmp_path, 1, membership, 3, SPE) is None  # no checkpoint of 3


def test_the_peers_agree_on_the_newest_epoch_every_one_can_resume(tmp_path):
    class Config:
        epochs = 3

    def files(*paths):
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")

    files(*(ckpt.checkpoint_path(tmp_path, r, e) for r in (0, 2) for e in (1, 2, 3)))
    files(ckpt.checkpoint_path(tmp_path, 1, 3))  # peer 1: back by epoch 3, no away file yet

    def agree(comm):
        return churn_resume._agree(comm, tmp_path, Membership(), Config(), SPE)

    assert LocalCluster(topologies.ring(3), cooperative=False).run(agree) == [3] * 3
    ckpt.checkpoint_path(tmp_path, 1, 3).unlink()
    with pytest.raises(ValueError, match=r"^cannot resume .*: no epoch for which every peer holds"):
        LocalCluster(topologies.ring(3), cooperative=False).run(agree)
    files(away_path(tmp_path, 1, 10))  # its away file covers epochs 1 and 2
    assert LocalCluster(topologies.ring(3), cooperative=False).run(agree) == [2] * 3
