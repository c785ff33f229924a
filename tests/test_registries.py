"""The registries of every extension point (`gossip_powersgd.registries`): `--help-config` lists
what each accepts from the entries themselves, the entries' declared defaults are the ones their
code uses, and an incomplete entry is refused at registration naming what it lacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gossip_powersgd.registries import REGISTRIES, Setting


def test_help_config_lists_every_registry_from_its_entries():
    out = subprocess.run(
        [sys.executable, "-m", "gossip_powersgd.cli.train", "--help-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for heading in ("algorithm:", "backend:", "dataset:", "model:", "dp_mechanism:"):
        assert f"\n{heading} one of\n" in text
    for registry in REGISTRIES:
        for entry in registry:
            assert f"  {entry.name}" in text and entry.summary in text
    assert "      hidden: int (default 200)  hidden units per layer" in text  # lstm_lm's option


def test_declared_defaults_are_the_ones_the_code_uses():
    from gossip_powersgd.training import synthetic_images
    from gossip_powersgd.training.datasets import DATASETS

    declared = {k: s.default for k, s in DATASETS.get("synthetic_images").options.items()}
    assert declared == synthetic_images.DEFAULTS
    assert {k: s.type for k, s in DATASETS.get("synthetic_images").options.items()} == (
        synthetic_images.OPTIONS
    )


def test_each_kind_refuses_an_incomplete_entry_naming_what_it_lacks():
    from gossip_powersgd.privacy.mechanisms.registry import MECHANISMS
    from gossip_powersgd.training.architectures import MODELS, ModelKind
    from gossip_powersgd.training.datasets import DATASETS, DatasetKind

    class NoSummary(DatasetKind):
        name = "nosummary"

    with pytest.raises(TypeError, match=r"dataset NoSummary cannot be registered.*`summary`"):
        DATASETS.register(NoSummary)

    class BadOptions(ModelKind):
        name = "badoptions"
        summary = "options that are not Settings"
        options = {"width": int}

    with pytest.raises(TypeError, match=r"`options` \(a dict of spec key -> Setting"):
        MODELS.register(BadOptions)

    class NoLoad(DatasetKind):
        name = "noload"
        summary = "declares everything but the method that loads it"

    with pytest.raises(TypeError, match=r"does not declare `load` \(the method that loads it\)"):
        DATASETS.register(NoLoad)
    with pytest.raises(TypeError, match=r"is not a Mechanism subclass"):
        MECHANISMS.register(NoSummary)

    class Upper(DatasetKind):
        name = "Blobs"
        summary = "an upper-case name"
        options = {"n": Setting(int, 1)}

    with pytest.raises(TypeError, match=r"its own `name` \(lower case"):
        DATASETS.register(Upper)
    assert (
        "nosummary" not in DATASETS
        and "noload" not in DATASETS
        and "Blobs" not in DATASETS
        and "badoptions" not in MODELS
    )


def test_a_spec_means_its_entry_and_option_values_whatever_its_spelling():
    from gossip_powersgd.training.architectures import MODELS
    from gossip_powersgd.training.datasets import DATASETS

    same = DATASETS.meaning("synthetic_logreg:d=20,classes=4")
    assert same == DATASETS.meaning("Synthetic_Logreg:classes=04,d=20,noise=0.1")
    assert same != DATASETS.meaning("synthetic_logreg:d=20,classes=5")
    # an entry without options, a bring-your-own spec: as written, options in sorted order
    assert MODELS.meaning("MLP:8") == MODELS.meaning("mlp:8") != MODELS.meaning("mlp:8,8")
    assert MODELS.meaning("pkg.mod:fn:b=1,a=2") == MODELS.meaning("pkg.mod:fn:a=2,b=1")
    with pytest.raises(ValueError, match="dataset spec 'synthetic_logreg:d=x'"):
        DATASETS.meaning("synthetic_logreg:d=x")
