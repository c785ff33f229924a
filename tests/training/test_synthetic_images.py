"""The CIFAR-shaped synthetic stand-in `synthetic_images`: deterministic from the seed, CIFAR's
shapes and byte format, exactly balanced classes, records generated one by one (so a peer makes
only its own shard), and it trains ResNet-20 through the library's own pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossip_powersgd.training import synthetic_images as si
from gossip_powersgd.training.data import clear_dataset_cache, load_dataset, peer_shard
from gossip_powersgd.training.records import RecordDataset

SPEC = "synthetic_images:n=103,test=27,noise=0.7"


def test_shapes_bytes_and_options():
    d = load_dataset(SPEC, seed=0)
    assert isinstance(d, RecordDataset)
    assert (d.num_train, d.num_test, d.num_classes, d.input_shape) == (103, 27, 10, (3, 32, 32))
    x, y = d.read_train(np.arange(5))
    assert x.dtype == torch.uint8 and x.shape == (5, 3, 32, 32)  # CIFAR's bytes, untransformed
    assert y.dtype == torch.int64 and y.shape == (5,)
    assert d.x_test.dtype == torch.float32 and d.x_test.shape == (27, 3, 32, 32)
    g = torch.Generator().manual_seed(0)
    assert d.train_transform(x, g).shape == (5, 3, 32, 32)
    flat = load_dataset(SPEC + ",augment=false", seed=0)
    # without augmentation the transform is CIFAR's normalisation alone: the test set's own map
    from gossip_powersgd.training.records import _normalise

    assert torch.equal(flat.train_transform(x, g), _normalise(x))
    assert load_dataset("synthetic_images:classes=3,n=9,test=3", seed=0).num_classes == 3


def test_deterministic_from_the_seed():
    a = load_dataset(SPEC, seed=3)
    clear_dataset_cache()
    b = load_dataset(SPEC, seed=3)
    assert a is not b
    idx = np.array([0, 50, 102])
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)
    for ours, theirs in zip(a.read_train(idx), b.read_train(idx)):
        assert torch.equal(ours, theirs)
    assert a.fingerprint == b.fingerprint
    other = load_dataset(SPEC, seed=4)
    assert not torch.equal(other.x_test, a.x_test)
    assert other.fingerprint != a.fingerprint


def test_each_record_comes_from_its_own_generator():
    """A record does not depend on which other records are read with it, or in what order: what
    lets a peer generate its shard alone and still hold the same bytes as a whole-set read."""
    d = load_dataset(SPEC, seed=0)
    whole_x, whole_y = d.read_train(np.arange(d.num_train))
    some = np.array([77, 3, 41])
    x, y = d.read_train(some)
    assert torch.equal(x, whole_x[some]) and torch.equal(y, whole_y[some])
    single, _ = d.read_train(np.array([41]))
    assert torch.equal(single[0], whole_x[41])
    with pytest.raises(IndexError, match=r"\[0, 103\)"):
        d.read_train(np.array([103]))


def test_classes_are_exactly_balanced():
    d = load_dataset(SPEC, seed=1)
    counts = np.bincount(d.labels(), minlength=10)
    assert counts.min() == 103 // 10 and counts.max() == 103 // 10 + 1 and counts.sum() == 103
    test_counts = np.bincount(d.y_test.numpy(), minlength=10)
    assert test_counts.min() == 2 and test_counts.max() == 3
    _, y = d.read_train(np.arange(103))
    assert np.array_equal(y.numpy(), d.labels())  # the labels a partition sees are the records'


def test_pixels_span_the_byte_range_like_images():
    """The pixel map centres the teacher's output at 0.5 with scale 0.22 (module docstring): the
    mean over many pixels sits near 127.5 and nothing is constant."""
    d = load_dataset("synthetic_images:n=200,test=1", seed=0)
    x, _ = d.read_train(np.arange(200))
    values = x.to(torch.float64) / 255
    # 200 x 3072 pixels, but spatially correlated: a loose band around 0.5
    assert 0.4 < float(values.mean()) < 0.6
    assert 0.12 < float(values.std()) < 0.35


def test_noise_zero_records_of_a_class_are_shifted_copies_of_its_prototype():
    """With noise=0 a record is its class prototype rolled by at most MAX_SHIFT latent cells, so
    two records of one class differ by a shift: some roll of one latent equals the other's.
    Checked on the teacher's latent inputs, where the roll is exact."""
    teacher = si._Teacher(0, 10)
    labels = np.zeros(4, dtype=np.int64)
    fields = []
    for i in range(4):
        rng = np.random.default_rng([0, 1, i])
        rng.standard_normal((si.LATENT_CHANNELS, si.LATENT_SIZE, si.LATENT_SIZE))
        dy, dx = rng.integers(-si.MAX_SHIFT, si.MAX_SHIFT + 1, size=2)
        fields.append(np.roll(teacher.prototypes[0], (int(dy), int(dx)), axis=(1, 2)))
    images = si._records(teacher, labels, np.arange(4), 0, 1, noise=0.0)
    assert np.array_equal(images, teacher.images(np.stack(fields)))


@pytest.mark.parametrize(
    "spec, match",
    [
        ("synthetic_images:noise=-1", "noise >= 0"),
        # noise=inf made every image black (NaN pixels cast to uint8), noise=nan the same
        ("synthetic_images:noise=inf", "a finite noise >= 0"),
        ("synthetic_images:noise=nan", "a finite noise >= 0"),
        ("synthetic_images:n=5", "n >= classes"),
        ("synthetic_images:test=0", "test >= 1"),
        ("synthetic_images:colour=1", "unknown option 'colour'"),
        # each was a MemoryError traceback allocating its array
        (
            "synthetic_images:n=100000000000",
            r"n=100000000000 needs .* lower n \(at most 268435456\)",
        ),
        ("synthetic_images:test=1000000", r"test=1000000 needs .* lower test \(at most 87381\)"),
        ("synthetic_images:classes=10000000,n=20000000", r"lower classes \(at most 524288\)"),
    ],
)
def test_bad_specs_say_what_to_fix(spec, match):
    with pytest.raises(ValueError, match=match):
        load_dataset(spec, seed=0)


def test_a_peer_reads_only_its_own_shard(monkeypatch):
    d = load_dataset(SPEC, seed=0)
    asked = []
    real = d.read_train
    object.__setattr__(d, "read_train", lambda idx: asked.append(np.asarray(idx)) or real(idx))
    try:
        shards = [peer_shard(d, r, 4, "iid", seed=0) for r in range(4)]
    finally:
        object.__setattr__(d, "read_train", real)
    assert len(asked) == 4
    assert sorted(np.concatenate(asked).tolist()) == list(range(103))  # each record once
    assert sum(len(y) for _, y in shards) == 103


def test_resnet20_trains_on_it_through_the_library(tmp_path):
    """Two epochs of ring:4 through `train` with every per-batch transform (crop, flip,
    normalisation): the loop runs and reports finite figures (learning is shown on the page)."""
    from gossip_powersgd import LocalCluster
    import topologies

    from gossip_powersgd.training.config import config_from_dict
    from gossip_powersgd.training.trainer import train

    config = config_from_dict(
        dict(
            dataset="synthetic_images:n=48,test=8",
            model="resnet20:width=4",
            topology="ring:4",
            peers=4,
            algorithm="powergossip:rank=1",
            batch_size=4,
            epochs=2,
            lr=0.05,
            backend="local",
            quiet=True,
            log_every=0,
            checkpoint_every=0,
            out_dir=None,
            threads=1,
        )
    )
    results = LocalCluster(topologies.parse("ring:4"), timeout=120).run(train, config)
    summary = results[0]
    assert summary["steps"] == 2 * 3
    assert 0 <= summary["final_test_acc_avg_model"] <= 1
    assert np.isfinite(summary["final_train_loss"])
