"""`privacy.heldout`: the membership protocol's held-out split — disjoint from the members,
covering the victim's shard, with the shard's class mix in expectation, and never trained on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossip_powersgd.privacy.heldout import make_split
from privacy_attack_scenarios import SPLIT_DATA, tiny, train_all


def test_split_members_and_heldout_are_disjoint_and_cover_the_victims_shard():
    from gossip_powersgd.training.data import load_dataset, partition

    split = make_split(
        SPLIT_DATA, 4, "dirichlet:0.5", seed=3, victims=[1, 3], fraction=0.5, split_seed=7
    )
    shards = partition(load_dataset(SPLIT_DATA, 3).y_train, 4, "dirichlet:0.5", 3)
    for rank in range(4):
        members, heldout = set(split.members[rank]), set(split.heldout[rank])
        assert not members & heldout
        assert members | heldout == set(shards[rank].tolist())
        assert len(heldout) == (round(0.5 * len(shards[rank])) if rank in (1, 3) else 0)
    assert split.victims == (1, 3)
    record = split.record()  # the audit record holds the seeds and every index
    assert record["split_seed"] == 7 and record["heldout"]["1"] == split.heldout[1].tolist()
    assert make_split(SPLIT_DATA, 4, "dirichlet:0.5", 3, [1, 3], 0.5, 7).key() == split.key()
    with pytest.raises(ValueError, match="not ranks of a 4-peer run"):
        make_split(SPLIT_DATA, 4, "iid", 0, victims=[4])


def test_heldout_class_mix_matches_the_shard_in_expectation():
    """Over many split seeds the held-out count of each class averages h n_c / n (hypergeometric
    mean); the tolerance is 4 standard errors of the mean of the hypergeometric counts."""
    from gossip_powersgd.training.data import load_dataset

    y = load_dataset(SPLIT_DATA, 0).y_train.numpy()
    seeds = 200
    counts = []
    for s in range(seeds):
        split = make_split(
            SPLIT_DATA, 4, "dirichlet:0.5", 0, victims=[2], fraction=0.3, split_seed=s
        )
        counts.append(np.bincount(y[split.heldout[2]], minlength=4))
    shard = np.r_[split.members[2], split.heldout[2]]
    n, h = len(shard), len(split.heldout[2])
    share = np.bincount(y[shard], minlength=4) / n
    expected = h * share
    sd = np.sqrt(h * share * (1 - share) * (n - h) / (n - 1))
    assert np.all(np.abs(np.mean(counts, axis=0) - expected) <= 4 * sd / np.sqrt(seeds) + 1e-12)


def test_no_peer_ever_trains_on_a_held_out_record():
    """Through the training data path: every peer's batches (what its loop samples from) hold
    exactly its members, and no held-out row of any victim."""
    from gossip_powersgd.training.hooks import TrainingHooks

    split = make_split(SPLIT_DATA, 4, "iid", seed=0, victims=[0, 1], fraction=0.5, split_seed=1)
    seen = {}

    class Capture(TrainingHooks):
        name = "capture"

        def setup(self, context):
            self.context = context

        def after_step(self, step, loss):
            seen.setdefault(self.context.comm.rank, self.context.batches.x.clone())

    config = tiny(
        dataset=split.spec(), partition="local", release_peer_statistics=True, model="logreg"
    )
    train_all(config, Capture)
    held = torch.cat([split.heldout_set(v)[0] for v in split.victims])
    for rank in range(4):
        x = seen[rank]
        assert torch.equal(x, split.member_set(rank)[0])
        assert not (x[:, None, :] == held[None, :, :]).all(-1).any()


def test_another_split_seed_is_another_split_and_bad_settings_are_one_line_errors():
    first = make_split(SPLIT_DATA, 4, "iid", 0, victims=[2], fraction=0.5, split_seed=0)
    other = make_split(SPLIT_DATA, 4, "iid", 0, victims=[2], fraction=0.5, split_seed=1)
    assert other.key() != first.key()
    assert not np.array_equal(other.heldout[2], first.heldout[2])
    assert np.array_equal(other.members[0], first.members[0])  # no victim: its whole shard
    shard = len(first.members[2]) + len(first.heldout[2])  # round(0.0001 shard) holds out none
    for changes, words in [
        (dict(fraction=1.0), r"fraction \(the held-out share of each victim's shard\) must lie"),
        (dict(fraction=0.0), "must lie in \\(0, 1\\), got 0.0"),
        (dict(partition="local"), "the split itself is the run's partition: local"),
        (dict(fraction=0.0001), f"victim 2's shard has {shard} samples: too few to hold out"),
    ]:
        arguments = dict(partition="iid", fraction=0.5) | changes
        with pytest.raises(ValueError, match=words) as info:
            make_split(SPLIT_DATA, 4, seed=0, victims=[2], **arguments)
        assert "\n" not in str(info.value)
