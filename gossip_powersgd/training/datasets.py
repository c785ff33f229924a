"""The datasets a config's ``dataset`` names: `DATASETS`, a `Registry` of `DatasetKind` classes.

Each kind describes itself (name, summary, options with types and defaults) and loads its data in
`load(spec, options, seed)`: a dataset object with `data.Dataset`'s interface (a
`records.RecordDataset` reads per peer), or a tuple ``(x_train, y_train, x_test, y_test[,
num_classes])`` that `data.load_dataset` checks and converts as it does a bring-your-own one. A new
dataset is one file with a `DatasetKind` subclass plus `register_dataset(...)`; anything else with a
colon is a bring-your-own ``package.module:function`` (`data.py`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ..registries import Registry, Setting, option_types, with_defaults
from ..specs import Spec, parse_spec, spec_error, typed_options

__all__ = [
    "DatasetKind",
    "DATASETS",
    "register_dataset",
    "BYO_DATASET",
    "WHAT",
    "IN_MEMORY_DATA",
    "augmentation_off",
]

#: How dataset specs are named in errors (the grammar's style: ``dataset spec '<spec>': ...``).
WHAT = "dataset spec"
#: How a checkpoint names the digest of in-memory data (`data.content_digests`), before its dataset
#: spec quoted as written.
IN_MEMORY_DATA = "the data of dataset spec "
#: The spelling of a bring-your-own dataset, accepted beside the registered names.
BYO_DATASET = "package.module:function"


class DatasetKind:
    """One dataset. Subclasses declare `name`, `summary`, `options` ({key: Setting}) and
    `load`; `usage` (optional) is how `--help-config` and errors spell its spec."""

    name: str = None
    summary: str = None
    options: Dict[str, Setting] = {}
    usage: str = None

    def parse(self, spec: str, parsed: Spec) -> Dict[str, Any]:
        """The spec's options, typed, each missing one at its default (None: the kind's own)."""
        return with_defaults(
            self.options, typed_options(parsed, option_types(self.options), WHAT, spec)
        )

    def load(self, spec: str, options: Dict[str, Any], seed: int):
        """The data (see the module docstring), deterministic from `seed`."""
        raise NotImplementedError


DATASETS = Registry(
    "dataset",
    "dataset",
    DatasetKind,
    required={"load": "the method that loads it"},
    extra=(BYO_DATASET,),
)
register_dataset = DATASETS.register


def augmentation_off(spec: str) -> Optional[str]:
    """`spec` with ``augment=false`` where it names a registered dataset whose ``augment`` option
    is on (by default or set), else None. A spec that does not parse is None too: the dataset
    check names its problem (a feature's config check runs before it)."""
    try:
        parsed = parse_spec(spec, WHAT)
        kind = DATASETS.get(parsed.name) if parsed.name in DATASETS else None
        if kind is None or "augment" not in kind.options or not kind.parse(spec, parsed)["augment"]:
            return None
    except ValueError:
        return None
    options = {**parsed.options, "augment": "false"}
    return f"{parsed.name}:" + ",".join(f"{key}={value}" for key, value in options.items())


@register_dataset
class MNIST1D(DatasetKind):
    name = "mnist1d"
    summary = "MNIST-1D from the mnist1d package's generator, 4000/1000 x 40, 10 classes"
    options = {
        "num_samples": Setting(int, None, "records in all (the generator's default: 5000)"),
        "shuffle_seq": Setting(bool, None, "shuffle each signal's time steps"),
        "train_split": Setting(float, None, "share of the records for training (0.8)"),
        "seed": Setting(
            int, None, "the generator's seed (the standard data set's, whatever the run's)"
        ),
    }

    def load(self, spec, options, seed):
        """The standard MNIST-1D (seed 42) whatever the run's seed, unless `mnist1d:seed=N` asks."""
        from .data_cache import cached
        from .mnist1d_generator import STANDARD_SEED, generate

        recipe = {k: v for k, v in options.items() if v is not None}
        # the generator makes num_samples // 10 signals of each digit and splits them at
        # train_split: outside these ranges it fails inside numpy or leaves a split empty
        if recipe.get("num_samples", 10) < 10 or not 0 < recipe.get("train_split", 0.8) < 1:
            raise spec_error(
                WHAT,
                spec,
                "need num_samples >= 10 (one signal of each digit) and 0 < train_split < 1",
            )
        recipe["seed"] = recipe.pop("seed", STANDARD_SEED)
        # generated once per machine and kept on disk (data_cache.py): the processes of a run
        # under mpiexec no longer each import mnist1d and generate the same signals
        raw = cached("mnist1d", recipe, lambda: generate(recipe), ("mnist1d", "scipy"))
        return raw["x"], raw["y"], raw["x_test"], raw["y_test"], 10


@register_dataset
class SyntheticLogreg(DatasetKind):
    """x ~ N(0, I_d), y = argmax(x W* + noise) with a seeded teacher W* (d x classes).

    W* has entries ~ N(0, 1/d) so teacher logits have unit variance whatever ``d`` is, which makes
    ``noise`` (std of the logit noise) comparable across dimensions. A linear model can represent
    the teacher exactly, so logistic regression learns it well. Each array it builds (teacher d x
    classes, records n x d, logits n x classes) holds at most `records.MAX_GENERATED_NUMBERS`
    float64s: a larger spec is refused in one line, not left to fail allocating."""

    name = "synthetic_logreg"
    summary = "seeded linear classification problem (a teacher a linear model can learn)"
    options = {
        "d": Setting(int, 20, "input dimension"),
        "classes": Setting(int, 10, "number of classes"),
        "n": Setting(int, 5000, "records in all"),
        "noise": Setting(float, 0.1, "std of the teacher's logit noise"),
        "test": Setting(float, 0.2, "share of the records held out for testing"),
    }

    def load(self, spec, options, seed):
        d, classes, n = options["d"], options["classes"], options["n"]
        noise, test = options["noise"], options["test"]
        # noise=nan passed "noise < 0" and made every label 0 (argmax of NaN rows), a test
        # accuracy of 1.0; noise=inf made labels argmax of infinities, skewed to the low classes
        if d < 1 or classes < 2 or not 0 <= noise < np.inf or not 0 < test < 1:
            raise spec_error(
                WHAT, spec, "need d >= 1, classes >= 2, a finite noise >= 0 and 0 < test < 1"
            )
        n_test = int(round(n * test))
        if n_test < 1 or n - n_test < 1:
            raise spec_error(WHAT, spec, f"n={n} is too small for a {test:g} test split; raise n")
        _check_sizes(spec, d=d, classes=classes, n=n)
        rng = np.random.default_rng(seed)
        teacher = rng.standard_normal((d, classes)) / np.sqrt(d)
        x = rng.standard_normal((n, d))
        y = np.argmax(x @ teacher + noise * rng.standard_normal((n, classes)), axis=1)
        return x[n_test:], y[n_test:], x[:n_test], y[:n_test], classes


def _check_sizes(spec: str, **sizes: int) -> None:
    """Refuse (one line naming the sizes, the limit and the fix) a `synthetic_logreg` spec one of
    whose arrays would hold more than `records.MAX_GENERATED_NUMBERS` numbers: before,
    classes=1000000000 failed with a MemoryError traceback allocating the teacher."""
    from . import records  # here, not above: records imports torch, this module does not

    limit = records.MAX_GENERATED_NUMBERS
    for a, b in (("d", "classes"), ("n", "d"), ("n", "classes")):
        count = sizes[a] * sizes[b]
        if count > limit:
            raise spec_error(
                WHAT,
                spec,
                f"{a} x {b} = {sizes[a]} x {sizes[b]} = {count} numbers in one array, more than "
                f"the {limit} it builds at most; lower {a} or {b}",
            )


@register_dataset
class SyntheticImages(DatasetKind):
    name = "synthetic_images"
    summary = "a CIFAR-shaped synthetic stand-in (3 x 32 x 32), generated per peer record by record"
    options = {
        "n": Setting(int, 4096, "training records"),
        "test": Setting(int, 1000, "test records"),
        "classes": Setting(int, 10, "number of classes"),
        "noise": Setting(float, 1.0, "how much the classes overlap"),
        "augment": Setting(bool, True, "random crop and flip of training records"),
    }

    def load(self, spec, options, seed):
        from .synthetic_images import synthetic_images

        return synthetic_images(spec, options, seed)


class _FileDataset(DatasetKind):
    """Read from local files, record by record: each peer reads only its shard (`records.py`)."""

    def load(self, spec, options, seed):
        from . import records

        if not options.get("root"):
            raise spec_error(
                WHAT,
                spec,
                f"needs the folder of its files: {self.name}:root=DIR (or "
                f"--set dataset={self.name}:root=DIR); nothing is downloaded",
            )
        return getattr(records, self.name)(
            spec, {k: v for k, v in options.items() if v is not None}
        )


@register_dataset
class CIFAR10(_FileDataset):
    name = "cifar10"
    summary = "CIFAR-10 from its binary files in a local folder (nothing is downloaded)"
    options = {
        "root": Setting(str, None, "the folder of cifar-10-batches-bin (required)"),
        "augment": Setting(bool, True, "random crop and flip of training records"),
    }
    usage = "cifar10:root=<dir>"


@register_dataset
class WikiText2(_FileDataset):
    name = "wikitext2"
    summary = "WikiText-2 token sequences from local files (a language model's data)"
    options = {
        "root": Setting(str, None, "the folder of the wikitext-2 files (required)"),
        "bptt": Setting(int, 35, "tokens per sequence"),
        "split": Setting(str, "test", "the held-out split: test | valid"),
    }
    usage = "wikitext2:root=<dir>[,bptt=<n>,split=test|valid]"
