"""Bring-your-own torch Datasets (training/torch_datasets.py): what the peers compare, their
labels and their records' shapes."""

import sys
from pathlib import Path

import pytest
import torch

from gossip_powersgd.training.data import clear_dataset_cache, load_dataset, peer_shard

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "support"))

from tests.conftest import tiny_config  # noqa: E402
from tests.conftest import errors_on_every_rank as every_rank  # noqa: E402
from tests.training.test_records import local_train  # noqa: E402


# ---- bring-your-own torch Datasets: what the peers compare ------------------------------------------


@pytest.mark.parametrize("function", ["per_call_tensor_datasets", "per_call_labelled_datasets"])
def test_torch_datasets_whose_training_records_differ_across_ranks_are_refused(
    monkeypatch, function
):
    """Datasets that differ only in their training set (the test set is the same everywhere):
    a TensorDataset's records are in memory, a Dataset's `targets` are its labels; the digest
    covered neither, and the peers trained on inconsistent data (the 4 arrays were refused)."""
    from gossip_powersgd.training import data

    monkeypatch.setattr(data, "load_dataset", lambda name, seed=0: data._build_dataset(name, seed))
    errors = every_rank(tiny_config(f"dataset=reliability_fixtures:{function}"))
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith("AgreementError: dataset differs across ranks: ranks ")
    assert "usually unseeded randomness" in errors[0] and "\n" not in errors[0]


def test_a_resume_on_changed_training_records_of_torch_datasets_is_refused(tmp_path):
    """The checkpoint records the digest: a TensorDataset whose training records changed under
    the same spec is refused on resume, naming the spec, as changed arrays are."""
    import reliability_fixtures

    config = tiny_config(
        "dataset=reliability_fixtures:variant_tensor_datasets", "epochs=1", f"out_dir={tmp_path}"
    )
    clear_dataset_cache()
    assert len(local_train(config.to_dict())) == 4
    reliability_fixtures.VARIANT[0] = 1
    clear_dataset_cache()
    try:
        errors = every_rank(config, resume=True)
    finally:
        reliability_fixtures.VARIANT[0] = 0
        clear_dataset_cache()
    assert len(set(errors)) == 1 and "\n" not in errors[0], errors
    assert (
        "was written with other data: the data of dataset spec "
        "'reliability_fixtures:variant_tensor_datasets' has changed since the checkpoint"
    ) in errors[0]


# ---- bring-your-own torch Datasets: their labels ----------------------------------------------------


def _labelled_pair(train_labels, test_labels=(0, 1, 2, 1, 0)):
    """TensorDatasets of 3-feature records with these labels (a test set of classes 0..2)."""
    g = torch.Generator().manual_seed(0)
    train = torch.utils.data.TensorDataset(
        torch.randn(len(train_labels), 3, generator=g), torch.as_tensor(train_labels)
    )
    test = torch.utils.data.TensorDataset(
        torch.randn(len(test_labels), 3, generator=g), torch.as_tensor(test_labels)
    )
    return train, test


def fractional_train_labels():
    return _labelled_pair([0.0, 1.0, 2.7, 1.0, 0.0, 2.0])


def negative_train_labels():
    return _labelled_pair([0, 1, -100, 1, 0, 2])


def negative_test_labels():
    return _labelled_pair([0, 1, 2, 1, 0, 2], test_labels=[0, -1, 2])


@pytest.mark.parametrize(
    "function, message",
    [
        ("fractional_train_labels", "the train Dataset must hold integer class labels"),
        ("negative_train_labels", "the train Dataset has negative labels"),
        ("negative_test_labels", "the test Dataset has negative labels"),
    ],
)
def test_torch_datasets_labels_that_are_no_class_are_refused_naming_the_dataset(function, message):
    """A TensorDataset's float label 2.7 was cast to class 2 and trained on silently (the four
    arrays refused it); a label -100 was skipped by cross-entropy, and -1 in the test set counted
    as a wrong answer. Each is refused when read, naming the spec."""
    spec = f"tests.training.test_torch_datasets:{function}"
    clear_dataset_cache()
    try:
        with pytest.raises(ValueError, match=rf"^dataset spec '{spec}': {message}$"):
            data = load_dataset(spec)
            peer_shard(data, 0, 1, "iid", 0)
    finally:
        clear_dataset_cache()


def train_records_of_another_shape():
    train, test = _labelled_pair([0, 1, 2, 1, 0, 2])
    return torch.utils.data.TensorDataset(torch.zeros(6, 4), train.tensors[1]), test


def test_torch_datasets_training_records_of_another_shape_than_the_test_ones_are_refused():
    """Training records of 4 features beside test records of 3 passed the model check (run on
    test records) and failed at the first step inside the model ('mat1 and mat2 shapes cannot
    be multiplied'); they are refused when read, naming both shapes."""
    spec = "tests.training.test_torch_datasets:train_records_of_another_shape"
    clear_dataset_cache()
    try:
        data = load_dataset(spec)
        with pytest.raises(
            ValueError,
            match=rf"^dataset spec '{spec}': training records have shape \(4,\) but test "
            r"records \(3,\); return records of one shape$",
        ):
            peer_shard(data, 0, 1, "iid", 0)
    finally:
        clear_dataset_cache()
