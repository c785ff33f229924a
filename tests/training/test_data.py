"""Tests for gossip_powersgd.training.data: datasets, partitions, batches."""

import os
import random
import sys
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip_powersgd.training.data import (
    Batches,
    clear_dataset_cache,
    label_histogram,
    load_dataset,
    partition,
    peer_shard,
    skew,
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


# ---------------------------------------------------------------------------------- partitions


def check_partition(parts, n, num_peers):
    assert len(parts) == num_peers
    for p in parts:
        assert p.dtype == np.int64 and len(p) > 0 and np.all(np.diff(p) > 0)  # sorted, unique
    everything = np.concatenate(parts)
    assert len(everything) == n  # disjoint ...
    assert np.array_equal(np.sort(everything), np.arange(n))  # ... and complete


@settings(max_examples=60, deadline=None)
@given(
    num_peers=st.integers(1, 24),
    n=st.integers(48, 400),
    classes=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    spec=st.sampled_from(
        ["iid", "dirichlet:100", "dirichlet:0.5", "dirichlet:0.05", "shards:1", "shards:2"]
    ),
)
def test_partition_properties(num_peers, n, classes, seed, spec):
    labels = balanced_labels(n, classes, seed % 1000)
    parts = partition(labels, num_peers, spec, seed)
    check_partition(parts, n, num_peers)
    again = partition(labels, num_peers, spec, seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_partition_accepts_tensors_and_depends_on_seed():
    labels = balanced_labels(1000, 10)
    for spec in ["iid", "dirichlet:0.5", "shards:2"]:
        a = partition(torch.from_numpy(labels), 8, spec, seed=0)
        b = partition(labels, 8, spec, seed=0)
        c = partition(labels, 8, spec, seed=1)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_sizes_are_balanced():
    sizes = [len(p) for p in partition(np.zeros(103), 8, "iid", seed=0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103


def test_dirichlet_skew_grows_as_alpha_falls():
    labels = balanced_labels(2000, 10)
    mean_skew = {
        alpha: np.mean(
            [skew(partition(labels, 8, f"dirichlet:{alpha}", s), labels, 10) for s in range(5)]
        )
        for alpha in (100, 1, 0.1)
    }
    assert mean_skew[100] < 0.1 < mean_skew[1] < mean_skew[0.1]
    assert skew(partition(labels, 8, "iid", 0), labels, 10) < 0.1


def test_dirichlet_never_leaves_a_peer_empty():
    # Tiny alpha and barely more samples than peers: redraws alone rarely succeed, the repair must.
    labels = balanced_labels(60, 3)
    for seed in range(3):
        check_partition(partition(labels, 50, "dirichlet:0.001", seed), 60, 50)


def test_dirichlet_alpha_keyword_spelling():
    labels = balanced_labels(200, 4)
    a, b = partition(labels, 4, "dirichlet:0.3", 9), partition(labels, 4, "dirichlet:alpha=0.3", 9)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # The grammar's spellings of the same split: spaces, case, the value in brackets.
    for spec in (" Dirichlet : 0.3 ", "dirichlet:[0.3]", "dirichlet:alpha=[0.3]"):
        assert all(np.array_equal(x, y) for x, y in zip(a, partition(labels, 4, spec, 9)))
    c, d = partition(labels, 4, "shards:2", 9), partition(labels, 4, "shards:k=2", 9)
    assert all(np.array_equal(x, y) for x, y in zip(c, d))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_limit_labels_per_peer(k):
    labels = balanced_labels(1000, 10)
    parts = partition(labels, 10, f"shards:{k}", seed=4)
    # Shards (1000 / (10 k) samples) are no larger than a class (100), so each spans <= 2 labels.
    for p in parts:
        assert len(np.unique(labels[p])) <= 2 * k
    if k == 1:  # shards exactly one class wide: one label each
        assert all(len(np.unique(labels[p])) == 1 for p in parts)


@pytest.mark.parametrize(
    "n, peers, spec, match",
    [
        (5, 8, "iid", "cannot split 5 samples among 8 peers"),
        (20, 8, "shards:3", "24 shards but only 20 samples"),
        (100, 4, "dirichlet:0", "alpha must be > 0"),
        (100, 4, "dirichlet:-1", "alpha must be > 0"),
        (100, 4, "dirichlet", "missing alpha"),
        (100, 4, "dirichlet:abc", "alpha must be a number"),
        (100, 4, "shards:0", "k must be >= 1"),
        (100, 4, "shards:1.5", "k must be an integer"),
        (100, 4, "pathological", "valid: iid, dirichlet"),
        (100, 4, "iid:3", "iid takes no argument; write 'iid'"),
        (100, 4, "local:3", "local takes no argument; write 'local'"),
        # The one spec grammar and its error style: one value, named or positional, no other key.
        (
            100,
            4,
            "dirichlet:0.5,0.3",
            "^partition spec 'dirichlet:0.5,0.3': takes one value, alpha",
        ),
        (100, 4, "dirichlet:0.5,alpha=0.3", "takes one value, alpha; write it like dirichlet:0.5"),
        (100, 4, "dirichlet:beta=1", "^partition spec 'dirichlet:beta=1': unknown option 'beta'"),
        (100, 4, "shards:k=2,k=3", "option 'k' is given twice"),
        (100, 4, "shards:[2", "unbalanced square brackets"),
        (100, 0, "iid", "positive integer"),
    ],
)
def test_partition_errors(n, peers, spec, match):
    with pytest.raises(ValueError, match=match) as info:
        partition(balanced_labels(n, 4), peers, spec, seed=0)
    assert "\n" not in str(info.value)


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


def test_label_histogram_and_skew_bounds():
    assert label_histogram(torch.tensor([0, 2, 2, 3]), 5) == [1, 0, 2, 1, 0]
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        label_histogram([0, 3], 3)
    labels = np.array([0, 0, 1, 1])
    assert skew([np.array([0, 1]), np.array([2, 3])], labels, 2) == pytest.approx(0.5)
    assert skew([np.array([0, 2]), np.array([1, 3])], labels, 2) == pytest.approx(0.0)


# ------------------------------------------------------------------------------------- batches


def collect(batches, count):
    """The next `count` batches, crossing epoch boundaries."""
    out = []
    while len(out) < count:
        for xb, yb in batches:
            out.append((xb.clone(), yb.clone()))
            if len(out) == count:
                break
    return out


def test_batches_cover_each_epoch_once():
    x, y = torch.arange(23.0).unsqueeze(1), torch.arange(23)
    batches = Batches(x, y, batch_size=5, seed=0, rank=0)
    assert len(batches) == 5
    epoch = list(batches)
    assert [len(b[1]) for b in epoch] == [5, 5, 5, 5, 3]
    assert sorted(torch.cat([b[1] for b in epoch]).tolist()) == list(range(23))
    assert torch.equal(
        torch.cat([b[0] for b in epoch]).squeeze(1).long(), torch.cat([b[1] for b in epoch])
    )  # x and y stay paired
    assert batches.state_dict() == {"epoch": 1, "position": 0, "seed": 0}
    second = torch.cat([b[1] for b in batches])
    assert not torch.equal(second, torch.cat([b[1] for b in epoch]))  # reshuffled


def test_batches_resume_mid_epoch_reproduces_the_sequence():
    x, y = torch.randn(50, 3), torch.arange(50)
    reference = collect(Batches(x, y, 8, seed=11, rank=2), 20)  # 7 batches/epoch: ~3 epochs
    run = Batches(x, y, 8, seed=11, rank=2)
    first = collect(run, 10)  # stop mid-epoch 1
    state = run.state_dict()
    assert state == {"epoch": 1, "position": 3, "seed": 11}
    resumed = Batches(x, y, 8, seed=0, rank=2)
    resumed.load_state_dict(state)
    rest = collect(resumed, 10)
    for (xa, ya), (xb, yb) in zip(reference, first + rest):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_batches_differ_between_ranks_and_validate():
    x, y = torch.randn(40, 2), torch.arange(40)
    a = torch.cat([b[1] for b in Batches(x, y, 10, seed=0, rank=0)])
    b = torch.cat([b[1] for b in Batches(x, y, 10, seed=0, rank=1)])
    assert not torch.equal(a, b)
    with pytest.raises(ValueError):
        Batches(x, y, 0)
    with pytest.raises(ValueError):
        Batches(x, y[:5], 4)
    with pytest.raises(ValueError, match="invalid Batches state"):
        Batches(x, y, 10).load_state_dict({"epoch": 0, "position": 4, "seed": 0})


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
