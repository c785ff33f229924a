"""Tests for gossip_powersgd.training.data: loading datasets by spec and a peer's shard (each kind's
data: test_datasets.py; partitions: test_partition.py; batches: test_batches.py)."""

import os
import sys
import threading

import numpy as np
import pytest
import torch

from gossip_powersgd.training.data import (
    clear_dataset_cache,
    load_dataset,
    partition,
    peer_shard,
)
from tests.conftest import (
    TINY,
    cli,
)

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
)  # for "byo_fixtures:..." specs


def balanced_labels(n, classes, seed=0):
    """Labels with (almost) equal class counts, in random order."""
    return np.random.default_rng(seed).permutation(np.arange(n) % classes)


# ------------------------------------------- loading by spec, cached (each kind's data: test_datasets.py)


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist1d", seed=0)


def test_mnist1d_shapes(mnist):
    assert mnist.x_train.shape == (4000, 40) and mnist.x_test.shape == (1000, 40)
    assert mnist.y_train.shape == (4000,) and mnist.y_test.shape == (1000,)
    assert mnist.x_train.dtype == torch.float32 and mnist.y_train.dtype == torch.int64
    assert mnist.num_classes == 10 and mnist.input_shape == (40,) and mnist.name == "mnist1d"
    assert set(mnist.y_train.tolist()) == set(range(10))
    assert load_dataset("mnist1d", seed=0) is mnist  # cached


def test_concurrent_loads_share_one_dataset():
    clear_dataset_cache()
    results = [None] * 8

    def load(i):
        results[i] = load_dataset("mnist1d:num_samples=200", seed=3)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is results[0] for r in results)


def test_the_cache_keeps_the_datasets_loaded_last_only():
    """A seed sweep in one process kept every seed's dataset (each cifar10 or synthetic_images
    seed: its normalised test set) for good; now the CACHED_DATASETS loaded (or used) last."""
    from gossip_powersgd.training import data

    clear_dataset_cache()
    try:
        spec = "synthetic_logreg:d=2,classes=2,n=20"
        first = load_dataset(spec, seed=0)
        kept = [load_dataset(spec, seed=s) for s in range(1, data.CACHED_DATASETS)]
        assert load_dataset(spec, seed=0) is first  # used again: now the most recent
        load_dataset(spec, seed=data.CACHED_DATASETS)  # one more: seed 1, least recent, goes
        assert len(data._CACHE) == len(data._STAMPS) == data.CACHED_DATASETS
        assert load_dataset(spec, seed=0) is first
        assert load_dataset(spec, seed=1) is not kept[0]  # built again (equal, not the same)
        assert torch.equal(load_dataset(spec, seed=1).x_train, kept[0].x_train)
    finally:
        clear_dataset_cache()


# --------------------------------------------------------------------------- bring your own data


def test_byo_dataset_numpy_with_seed():
    a = load_dataset("byo_fixtures:linear_data", seed=1)
    assert a.x_train.shape == (50, 3) and a.x_test.shape == (10, 3) and a.num_classes == 2
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    b = load_dataset("byo_fixtures:linear_data", seed=2)
    assert not torch.equal(a.x_train, b.x_train)  # the seed reached the function


def test_byo_dataset_tensors_without_seed():
    d = load_dataset("byo_fixtures:tensor_data", seed=5)
    assert d.x_train.dtype == torch.float32 and d.y_train.tolist() == [0, 1, 2] * 3
    assert d.num_classes == 3 and d.input_shape == (2,)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("byo_fixtures:missing", "no attribute 'missing'"),
        ("byo_fixtures:NOT_CALLABLE", "not callable"),
        ("byo_fixtures:three_arrays", "must return a tuple"),
        ("byo_fixtures:mismatched_lengths", "10 samples but y_train has 9"),
        ("byo_fixtures:fractional_labels", "integer class labels"),
        ("byo_fixtures:broken", "disk on fire"),
    ],
)
def test_byo_dataset_errors(spec, match):
    with pytest.raises(ValueError, match=match) as info:
        load_dataset(spec)
    assert spec in str(info.value) and "\n" not in str(info.value)


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match="mnist1d.*synthetic_logreg"):
        load_dataset("imagenet")


# ------------------------------------------------------------------ a peer's shard (partitions:
# test_partition.py; batches: test_batches.py)


def test_peer_shard_is_the_partition_slice():
    data = load_dataset("synthetic_logreg:d=4,classes=3,n=300")
    parts = partition(data.y_train, 5, "dirichlet:0.5", seed=3)
    for rank in range(5):
        x, y = peer_shard(data, rank, 5, "dirichlet:0.5", seed=3)
        index = torch.from_numpy(parts[rank])
        assert torch.equal(x, data.x_train[index]) and torch.equal(y, data.y_train[index])
        assert x.untyped_storage().data_ptr() != data.x_train.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="rank 5 out of range"):
        peer_shard(data, 5, 5, "iid", seed=0)


def test_an_empty_test_set_is_refused_at_load_time(tmp_path, capsys):
    code, lines = cli(
        [
            "--config",
            TINY,
            "--set",
            "dataset=reliability_fixtures:empty_test_set",
            "--set",
            f"out_dir={tmp_path / 'run'}",
        ],
        capsys,
    )
    assert code != 0 and lines == [
        "error: bad value for 'dataset': dataset spec 'reliability_fixtures:"
        "empty_test_set': the test set is empty; return at least one "
        "test sample (x_test, y_test)"
    ]


def test_a_huge_label_is_refused_before_anything_is_sized_by_it(tmp_path, capsys):
    code, lines = cli(
        [
            "--config",
            TINY,
            "--set",
            "dataset=reliability_fixtures:huge_label",
            "--set",
            f"out_dir={tmp_path / 'run'}",
        ],
        capsys,
    )
    assert code != 0 and len(lines) == 1, lines
    assert (
        "label 1000000000 in y_train implies 1000000001 classes but only 3 distinct labels occur"
    ) in lines[0]
