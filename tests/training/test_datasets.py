"""training/datasets.py: the registered dataset kinds, their options and what each loads (loading
and caching by spec, bring-your-own data: test_data.py)."""

import numpy as np
import pytest
import torch

from gossip_powersgd.specs import parse_spec
from gossip_powersgd.training.data import clear_dataset_cache, load_dataset
from gossip_powersgd.training.datasets import DATASETS


def kind_load(spec, seed=0):
    kind = DATASETS.get(parse_spec(spec).name)
    return kind.load(spec, kind.parse(spec, parse_spec(spec)), seed)


def test_parse_fills_every_missing_option_with_its_declared_default():
    def parse(spec):
        return DATASETS.get(parse_spec(spec).name).parse(spec, parse_spec(spec))

    assert parse("synthetic_logreg:d=3") == {
        "d": 3,
        "classes": 10,
        "n": 5000,
        "noise": 0.1,
        "test": 0.2,
    }
    assert parse("mnist1d") == dict.fromkeys(["num_samples", "shuffle_seq", "train_split", "seed"])
    assert parse("wikitext2:root=/d")["split"] == "test"


def test_synthetic_logreg_holds_out_its_first_records_and_is_the_seeded_teachers():
    """n=1000, test=0.25: the first 250 records are the test set; the labels are the argmax of the
    seeded teacher's logits (noise=0: a linear model represents them exactly, so the teacher's own
    argmax on the held-out x is 100 % accurate)."""
    x, y, x_test, y_test, classes = kind_load(
        "synthetic_logreg:d=6,classes=3,n=1000,test=0.25,noise=0", 5
    )
    assert (x.shape, x_test.shape, classes) == ((750, 6), (250, 6), 3)
    rng = np.random.default_rng(5)
    teacher = rng.standard_normal((6, 3)) / np.sqrt(6)
    everything = rng.standard_normal((1000, 6))
    assert np.array_equal(x_test, everything[:250]) and np.array_equal(x, everything[250:])
    assert np.array_equal(y_test, np.argmax(x_test @ teacher, axis=1))
    assert set(np.unique(y)) == {0, 1, 2}


@pytest.mark.parametrize("spec", ["synthetic_logreg:test=1", "synthetic_logreg:noise=-1"])
def test_synthetic_logreg_out_of_range_options_name_the_ranges(spec):
    with pytest.raises(ValueError, match=rf"^dataset spec '{spec}': need d >= 1, classes >= 2"):
        kind_load(spec)


@pytest.mark.parametrize("noise", ["nan", "inf"])
def test_synthetic_logreg_non_finite_noise_is_refused(noise):
    """noise=nan passed the noise >= 0 check and labelled every record 0 (argmax of NaN rows):
    a run reported a test accuracy of 1.0 on a one-class problem; noise=inf skewed the labels."""
    spec = f"synthetic_logreg:noise={noise}"
    with pytest.raises(ValueError, match=rf"^dataset spec '{spec}': .*a finite noise >= 0"):
        kind_load(spec)


@pytest.mark.parametrize("name", ["cifar10", "wikitext2"])
def test_a_file_dataset_without_its_folder_says_how_to_name_it(name):
    with pytest.raises(
        ValueError,
        match=rf"^dataset spec '{name}': needs the folder of its files: {name}:root=DIR \(or "
        rf"--set dataset={name}:root=DIR\); nothing is downloaded$",
    ):
        kind_load(name)


def test_mnist1d_is_the_standard_data_set_whatever_the_run_seed():
    """The package's seed 42 unless the spec names another: runs with other seeds share the data."""
    a = load_dataset("mnist1d:num_samples=500", seed=0)
    b = load_dataset("mnist1d:num_samples=500", seed=7)
    c = load_dataset("mnist1d:num_samples=500,seed=42", seed=7)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.x_train, c.x_train)


def test_mnist1d_bad_option():
    with pytest.raises(ValueError, match="num_sample"):
        load_dataset("mnist1d:num_sample=10")


@pytest.mark.parametrize(
    "options", ["num_samples=3", "num_samples=-5", "train_split=0", "train_split=1.5"]
)
def test_mnist1d_out_of_range_options_name_the_ranges(options):
    """Refused before the generator runs (num_samples < 10 failed inside numpy: 'need at least
    one array to stack'; a train_split outside (0, 1) said only that a split was empty)."""
    spec = f"mnist1d:{options}"
    with pytest.raises(ValueError) as info:
        kind_load(spec)
    assert str(info.value) == (
        f"dataset spec '{spec}': need num_samples >= 10 (one signal of each digit) and "
        "0 < train_split < 1"
    )


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


def test_both_generated_datasets_take_their_size_limit_from_one_home(monkeypatch):
    """synthetic_logreg and synthetic_images each defined 2**28 as their limit; both now read
    `records.MAX_GENERATED_NUMBERS`, so lowering it there (to 1000) lowers both: the default
    specs (n x d = 5000 x 20 records; n = 4096 labels) are then refused, naming it."""
    from gossip_powersgd.training import records

    assert records.MAX_GENERATED_NUMBERS == 1 << 28  # 2 GiB of float64
    monkeypatch.setattr(records, "MAX_GENERATED_NUMBERS", 1000)
    with pytest.raises(ValueError, match="more than the 1000 it builds at most; lower n or d"):
        kind_load("synthetic_logreg")
    with pytest.raises(
        ValueError, match=r"more than the 1000 it builds at most; lower n \(at most 1000\)"
    ):
        kind_load("synthetic_images")


@pytest.mark.parametrize(
    "options, product",
    [
        ("classes=1000000000", "d x classes = 20 x 1000000000 = 20000000000"),
        ("d=1000000000", "d x classes = 1000000000 x 10 = 10000000000"),
        ("n=1000000000,classes=2", "n x d = 1000000000 x 20 = 20000000000"),
        ("n=100000000,d=1", "n x classes = 100000000 x 10 = 1000000000"),
    ],
)
def test_synthetic_logreg_too_large_to_build_is_refused_in_one_line(options, product):
    """Before: classes=1000000000 failed with a MemoryError traceback allocating the teacher (149
    GiB); now each array (teacher, records, logits) is bounded before anything is allocated."""
    spec = f"synthetic_logreg:{options}"
    with pytest.raises(ValueError) as info:
        kind_load(spec)
    a, b = product.split(" = ")[0].split(" x ")
    assert str(info.value) == (
        f"dataset spec '{spec}': {product} numbers in one array, more than the 268435456 it "
        f"builds at most; lower {a} or {b}"
    )
