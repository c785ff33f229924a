"""training/partition.py: per-peer partitions of the training records, label histograms and skew
(a peer's shard of a dataset: test_data.py)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip_powersgd.training.partition import (
    label_histogram,
    partition,
    partition_meaning,
    skew,
)
from tests.training.test_data import balanced_labels


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


def test_label_histogram_and_skew_bounds():
    assert label_histogram(torch.tensor([0, 2, 2, 3]), 5) == [1, 0, 2, 1, 0]
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        label_histogram([0, 3], 3)
    labels = np.array([0, 0, 1, 1])
    assert skew([np.array([0, 1]), np.array([2, 3])], labels, 2) == pytest.approx(0.5)
    assert skew([np.array([0, 2]), np.array([1, 3])], labels, 2) == pytest.approx(0.0)


def test_contiguous_is_consecutive_runs_in_order_sizes_within_one():
    parts = partition(np.zeros(23), 4, "contiguous", seed=99)
    assert [p.tolist() for p in parts] == [
        list(range(0, 6)),
        list(range(6, 12)),
        list(range(12, 18)),
        list(range(18, 23)),
    ]
    assert [p.tolist() for p in partition(np.zeros(23), 4, "contiguous", seed=0)] == [
        p.tolist() for p in parts
    ]  # no randomness: the seed does not matter


def test_local_and_two_dimensional_labels_are_refused_with_why():
    with pytest.raises(ValueError, match=r"^partition: local has no global split to compute"):
        partition(np.zeros(10), 2, "local", seed=0)
    with pytest.raises(ValueError, match=r"^labels must be 1-D, got shape \(5, 2\)$"):
        partition(np.zeros((5, 2)), 2, "iid", seed=0)
    with pytest.raises(ValueError, match="num_peers must be a positive integer, got True"):
        partition(np.zeros(10), True, "iid", seed=0)


def test_shards_of_one_class_each_give_every_peer_one_label_and_the_skew_its_closed_form():
    """10 peers, shards:1 over 10 balanced classes: each peer holds one whole class, so its label
    distribution is a point mass and its total-variation distance to the uniform mix is
    0.5 * ((1 - 1/10) + 9 * 1/10) = 0.9, exactly (up to float rounding of the sum)."""
    labels = np.repeat(np.arange(10), 30)
    parts = partition(labels, 10, "shards:1", seed=1)
    assert sorted(int(labels[p[0]]) for p in parts) == list(range(10))
    assert all(len(p) == 30 and len(np.unique(labels[p])) == 1 for p in parts)
    assert skew(parts, labels, 10) == pytest.approx(0.9, rel=1e-15)
    with pytest.raises(ValueError, match="peer 1 has no samples"):
        skew([np.arange(300), np.array([], dtype=np.int64)], labels, 10)


def test_a_partition_spec_means_its_name_and_number_whatever_its_spelling():
    assert partition_meaning("dirichlet:0.5") == partition_meaning("Dirichlet:alpha=0.50")
    assert partition_meaning("dirichlet:0.5") != partition_meaning("dirichlet:0.6")
    assert partition_meaning("shards:2") == partition_meaning("shards:k=02") == ("shards", 2)
    assert partition_meaning("iid") == partition_meaning(" IID ") != partition_meaning("contiguous")
    with pytest.raises(ValueError, match="partition spec 'shards:two'"):
        partition_meaning("shards:two")
