"""A new dataset is one file plus one registry line: this file is the file,
`register_dataset(Blobs)` (in the fixture, so that the registry other tests see stays as shipped)
the line. The class describes itself (options with types and defaults); a config names it, the
data loader builds it, `run` trains on it and `--help-config` lists it."""

from __future__ import annotations

import numpy as np
import pytest

from gossip_powersgd import run
from gossip_powersgd.cli.help import describe_registries
from gossip_powersgd.registries import Setting
from gossip_powersgd.training import data
from gossip_powersgd.training.datasets import DATASETS, DatasetKind, register_dataset


class Blobs(DatasetKind):
    """`classes` Gaussian blobs in `d` dimensions, centres 4 apart on the axes, std `spread`."""

    name = "blobs"
    summary = "Gaussian blobs, one per class (the example dataset)"
    options = {
        "n": Setting(int, 1000, "records in all"),
        "classes": Setting(int, 3, "number of classes (<= d)"),
        "d": Setting(int, 8, "input dimension"),
        "spread": Setting(float, 0.5, "std of each blob"),
    }

    def load(self, spec, options, seed):
        rng = np.random.default_rng(seed)
        n, k, d = options["n"], options["classes"], options["d"]
        y = rng.integers(0, k, size=n)
        x = 4.0 * np.eye(d)[y] + options["spread"] * rng.standard_normal((n, d))
        cut = n // 5
        return x[cut:], y[cut:], x[:cut], y[:cut], k


@pytest.fixture
def registered():
    register_dataset(Blobs)
    data.clear_dataset_cache()
    yield
    DATASETS.unregister("blobs")
    data.clear_dataset_cache()


def test_the_loader_builds_it_with_typed_options_and_defaults(registered):
    dataset = data.load_dataset("blobs:n=500,spread=0.25", seed=3)
    assert dataset.num_train == 400 and dataset.num_test == 100 and dataset.num_classes == 3
    assert dataset.input_shape == (8,) and str(dataset.x_train.dtype) == "torch.float32"
    assert "blobs[:n=<int>,classes=<int>,d=<int>,spread=<float>]" in data.DATASET_NAMES
    with pytest.raises(ValueError, match=r"dataset spec 'blobs:n=many'.*n"):
        data.load_dataset("blobs:n=many")
    with pytest.raises(ValueError, match=r"dataset spec 'blobs:colour=red'.*colour"):
        data.load_dataset("blobs:colour=red")
    text = describe_registries()
    assert "  blobs  Gaussian blobs" in text and "      spread: float (default 0.5)" in text


def test_a_config_naming_it_trains_to_the_accuracy_its_separation_allows(registered):
    # Centres 4 apart with std 0.5: a record is nearer another class's centre with probability
    # about Phi(-4 / (2 sqrt(2) 0.5)) per competing class, ~1e-3, so a linear model that has
    # learned anything is near 100 %; 0.9 leaves room for one epoch of SGD.
    result = run(
        dict(
            topology="ring:4",
            algorithm="exact",
            dataset="blobs",
            model="logreg",
            lr=0.5,
            epochs=1,
            eval_every=1,
            seed=0,
            quiet=True,
        )
    )
    assert result.config.dataset == "blobs" and result.acc_avg > 0.9


def test_unregistered_it_is_an_unknown_name_again(registered):
    DATASETS.unregister("blobs")
    with pytest.raises(ValueError, match=r"unknown name 'blobs'.*mnist1d"):
        data.load_dataset("blobs")
