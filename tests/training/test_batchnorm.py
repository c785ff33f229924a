"""BatchNorm in a decentralized run: the averaged model's statistics are recomputed."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training.batchnorm import refresh_batch_norm
from gossip_powersgd.training.config import config_from_dict
from gossip_powersgd.training.trainer import train
from tests.conftest import errors_on_every_rank as every_rank
from tests.conftest import tiny_config

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "support")
)  # for "paper_fixtures:..." specs


def test_refreshed_statistics_are_the_pooled_ones():
    inputs = [
        torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(r)) * (r + 1) + r
        for r in range(3)
    ]

    def peer(comm):
        model = nn.Sequential(nn.BatchNorm1d(3)).eval()
        model[0].running_mean.fill_(5.0)  # stale statistics: overwritten
        assert refresh_batch_norm(model, [inputs[comm.rank][0], inputs[comm.rank][1]], comm)
        assert not model.training  # its mode is restored
        return model[0].running_mean.clone(), model[0].running_var.clone()

    results = LocalCluster(topologies.parse("ring:3"), timeout=30).run(peer)
    # closed form: a peer's cumulative statistics are the means of its two batches' mean and
    # unbiased variance; the pooled variance is mean(var + mean^2) - mean^2 over the peers
    means = [torch.stack([b.mean(0) for b in x]).mean(0).double() for x in inputs]
    variances = [torch.stack([b.var(0) for b in x]).mean(0).double() for x in inputs]
    mean = sum(means) / 3
    var = sum(v + m**2 for v, m in zip(variances, means)) / 3 - mean**2
    for got_mean, got_var in results:
        # float32 statistics of O(10) values: 1e-5 relative is a few float32 ulps of accumulation
        assert torch.allclose(got_mean.double(), mean, rtol=1e-5, atol=1e-5)
        assert torch.allclose(got_var.double(), var, rtol=1e-5, atol=1e-5)


def test_model_without_batch_norm_is_left_alone():
    model = nn.Linear(3, 2)
    assert refresh_batch_norm(model, [torch.randn(2, 3)], comm=None) is False


@pytest.mark.parametrize("algorithm", ["powergossip:rank=1", "exact"])
def test_averaged_bn_model_is_at_least_as_good_as_the_worst_local_one(algorithm):
    config = config_from_dict(
        dict(
            topology="ring:4",
            algorithm=algorithm,
            dataset="paper_fixtures:class_images",
            model="resnet20:width=4",
            batch_size=16,
            epochs=2,
            lr=0.05,
            momentum=0.9,
            quiet=True,
        )
    )
    summary = LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config)[0]
    for record in (r for r in summary["history"] if r["kind"] == "eval"):
        assert record["test_acc_avg_model"] >= record["test_acc_min"], record
        # stronger, and what the peers' mean statistics missed (after epoch 1 their averaged
        # model fell below the mean local accuracy here): at least the mean local model
        assert record["test_acc_avg_model"] >= record["test_acc_mean"], record
    assert summary["final_test_acc_avg_model"] > 0.5  # chance is 0.25: the models learned


def test_batch_norm_on_a_one_sample_last_batch_is_told_to_change_the_batch_size():
    """tiny's 1600 training samples give each of 4 peers 400: batch_size 399 leaves 1."""
    errors = every_rank(tiny_config("model=reliability_fixtures:batch_norm_net", "batch_size=399"))
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith(
        "ValueError: model 'reliability_fixtures:batch_norm_net' cannot train "
        "on a batch of 1 sample (Expected more than 1 value per channel"
    )
    assert "change batch_size (e.g. to 400)" in errors[0]
    assert (
        every_rank(
            tiny_config("model=reliability_fixtures:batch_norm_net", "batch_size=398", "epochs=1")
        )
        == ["ok"] * 4
    )


def test_peers_statistics_weigh_by_their_samples_and_one_without_any_adds_nothing():
    """Peer 0 ran 2 batches of 4 samples, peer 1 one of 2, peer 2 none (a one-sample shard): its
    statistics were the reset ones (mean 0, var 1) and pulled the pooled mean toward 0 with the
    weight of a full peer. Where no peer ran a sample the model keeps the statistics it had."""
    g = torch.Generator().manual_seed(0)
    inputs = [
        [torch.randn(4, 3, generator=g) * 2 + 5, torch.randn(4, 3, generator=g) + 4],
        [torch.randn(2, 3, generator=g) * 3 + 6],
        [],
    ]

    def peer(comm, inputs=inputs):
        model = nn.Sequential(nn.BatchNorm1d(3)).eval()
        model[0].running_mean.fill_(5.0)
        model[0].running_var.fill_(2.0)
        assert refresh_batch_norm(model, inputs[comm.rank], comm)
        return model[0].running_mean.clone(), model[0].running_var.clone()

    # closed form: a peer's statistics are the means of its batches' mean and unbiased variance;
    # the pooled ones weigh peer k by its samples n_k: mean = sum n_k m_k / N, variance =
    # sum n_k (v_k + m_k^2) / N - mean^2 (peer 2: n = 0)
    means = [torch.stack([b.mean(0) for b in x]).mean(0).double() for x in inputs[:2]]
    variances = [torch.stack([b.var(0) for b in x]).mean(0).double() for x in inputs[:2]]
    mean = (8 * means[0] + 2 * means[1]) / 10
    var = (8 * (variances[0] + means[0] ** 2) + 2 * (variances[1] + means[1] ** 2)) / 10 - mean**2
    for got_mean, got_var in LocalCluster(topologies.parse("ring:3"), timeout=30).run(peer):
        # float32 statistics of O(10) values: 1e-5 relative is a few float32 ulps of accumulation
        assert torch.allclose(got_mean.double(), mean, rtol=1e-5, atol=1e-5)
        assert torch.allclose(got_var.double(), var, rtol=1e-5, atol=1e-5)
    none = LocalCluster(topologies.parse("ring:3"), timeout=30).run(
        lambda comm: peer(comm, [[], [], []])
    )
    assert all(m.eq(5.0).all() and v.eq(2.0).all() for m, v in none)  # left as they were


def test_a_batch_size_of_one_refreshes_on_batches_of_two():
    """Training-mode BatchNorm cannot measure a batch of one sample: with batch_size 1 every peer
    yielded no batch and the averaged model's statistics were the reset ones (0, 1)."""
    from types import SimpleNamespace

    from gossip_powersgd.training.batchnorm import refresh_inputs

    x = torch.arange(5.0)[:, None]
    batches = SimpleNamespace(batch_size=1, x=x, transform=None, seed=0, rank=0)
    got = list(refresh_inputs(batches, 0))
    assert [len(b) for b in got] == [2, 2]  # the fifth sample alone is no batch
    values = torch.cat(got).flatten().tolist()
    assert len(set(values)) == 4 and set(values) <= set(range(5))  # distinct shard samples


def test_the_refresh_batches_sample_a_shard_stored_class_by_class():
    """A shard keeps its dataset's order: of a training set stored class by class (as
    torchvision's ImageFolder keeps it) the first 8 batches held the first class only, and the
    averaged model's BatchNorm statistics were that class's (mean -3 of a shard whose mean is 0;
    its test accuracy fell to 0.73 where every local model had 1.0). The batches are now a
    sample of the shard, drawn without replacement from (seed, rank, step)."""
    from types import SimpleNamespace

    from gossip_powersgd.training.batchnorm import BN_REFRESH_BATCHES, refresh_inputs

    index = torch.arange(1000.0)[:, None]  # which sample it is
    sorted_x = torch.where(index < 500, -3.0, 3.0)  # the first class, then the second
    shard = SimpleNamespace(batch_size=16, x=torch.cat([sorted_x, index], 1), transform=None)

    def taken(seed=0, rank=0, step=0):
        shard.seed, shard.rank = seed, rank
        return torch.cat(list(refresh_inputs(shard, step)))

    got = taken()
    assert got.shape == (BN_REFRESH_BATCHES * 16, 2)
    assert len(set(got[:, 1].tolist())) == len(got)  # no sample twice
    # 128 of 1000 drawn without replacement: the share of the second class has a standard
    # deviation of 0.042 about 1/2, so a mean within 1.5 of 0 (a share in [0.25, 0.75]) is 6
    # deviations wide; the first batches in storage order give -3 exactly
    assert abs(float(got[:, 0].mean())) < 1.5
    assert torch.equal(taken(), got)  # a pure function of (seed, rank, step)
    assert not torch.equal(taken(step=1), got) and not torch.equal(taken(rank=1), got)
