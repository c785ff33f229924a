"""Tests for gossip_powersgd.training.data: datasets and a peer's shard (the partitions themselves:
test_partition.py; batches: test_batches.py)."""

import os
import random
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


# --------------------------------------------------------------------------------------- mnist1d


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


def test_mnist1d_deterministic_per_seed_and_leaves_global_rngs_alone(monkeypatch):
    monkeypatch.setenv("GOSSIP_POWERSGD_CACHE", "off")  # generated here, not read from disk
    clear_dataset_cache()
    np.random.seed(123)
    random.seed(123)
    np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
    a = load_dataset("mnist1d:num_samples=500,seed=1")
    assert np.array_equal(np.random.get_state()[1], np_before) and random.getstate() == py_before
    assert a.x_train.shape == (400, 40) and a.x_test.shape == (100, 40)
    clear_dataset_cache()
    b = load_dataset("mnist1d:num_samples=500,seed=1")
    assert a is not b and torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    c = load_dataset("mnist1d:num_samples=500,seed=2")
    assert not torch.equal(a.x_train, c.x_train)


def test_mnist1d_is_the_standard_data_set_whatever_the_run_seed():
    """The package's seed 42 unless the spec names another: runs with other seeds share the data."""
    a = load_dataset("mnist1d:num_samples=500", seed=0)
    b = load_dataset("mnist1d:num_samples=500", seed=7)
    c = load_dataset("mnist1d:num_samples=500,seed=42", seed=7)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.x_train, c.x_train)


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


def test_mnist1d_bad_option():
    with pytest.raises(ValueError, match="num_sample"):
        load_dataset("mnist1d:num_sample=10")


# ------------------------------------------------------------------------------ synthetic_logreg


def test_synthetic_logreg_defaults_and_options():
    d = load_dataset("synthetic_logreg", seed=0)
    assert d.x_train.shape == (4000, 20) and d.x_test.shape == (1000, 20) and d.num_classes == 10
    s = load_dataset("synthetic_logreg:d=5,classes=4,n=1000", seed=7)
    assert s.x_train.shape == (800, 5) and s.x_test.shape == (200, 5) and s.num_classes == 4
    assert s.input_shape == (5,) and int(s.y_train.max()) < 4
    clear_dataset_cache()
    again = load_dataset("synthetic_logreg:d=5,classes=4,n=1000", seed=7)
    assert torch.equal(s.x_train, again.x_train) and torch.equal(s.y_train, again.y_train)
    other = load_dataset("synthetic_logreg:d=5,classes=4,n=1000", seed=8)
    assert not torch.equal(s.x_train, other.x_train)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("synthetic_logreg:dim=5", "unknown option 'dim'"),
        ("synthetic_logreg:d=five", "d must be an integer, got 'five'"),
        ("synthetic_logreg:classes=1", "classes >= 2"),
        ("synthetic_logreg:n=2", "too small"),
        ("synthetic_logreg:d", "key=value"),
    ],
)
def test_synthetic_logreg_bad_options(spec, match):
    with pytest.raises(ValueError, match=match):
        load_dataset(spec)


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
