"""Tests for gossip_powersgd.training.models."""

import os
import sys
import threading

import pytest
import torch

from gossip_powersgd.training.data import Batches, load_dataset
from gossip_powersgd.training.models import build_model
from tests.conftest import (
    TINY,
    cli,
    tiny_config,
)
from tests.conftest import errors_on_every_rank as every_rank

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
)  # for "byo_fixtures:..." specs

SPECS = ["logreg", "mlp", "mlp:16", "mlp:32,16,8", "cnn1d", "cnn1d:channels=8"]


def same_parameters(a, b):
    pa, pb = list(a.parameters()), list(b.parameters())
    return len(pa) == len(pb) and all(torch.equal(x, y) for x, y in zip(pa, pb))


@pytest.mark.parametrize("spec", SPECS)
def test_output_shape_and_determinism(spec):
    model = build_model(spec, (40,), 10, seed=3)
    assert model(torch.randn(7, 40)).shape == (7, 10)
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in model.parameters())
    assert same_parameters(model, build_model(spec, (40,), 10, seed=3))
    assert not same_parameters(model, build_model(spec, (40,), 10, seed=4))


@pytest.mark.parametrize("spec", SPECS + ["byo_fixtures:small_net"])
def test_global_rng_untouched(spec):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    build_model(spec, (40,), 10, seed=5)
    assert torch.equal(torch.get_rng_state(), state)


def test_concurrent_builds_are_identical():
    specs = ["cnn1d", "byo_fixtures:small_net"]
    models = {s: [None] * 8 for s in specs}

    def build(i):
        for s in specs:
            models[s][i] = build_model(s, (40,), 10, seed=1)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in specs:
        assert all(same_parameters(models[s][0], m) for m in models[s][1:])


def test_default_init_scale():
    # PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases.
    layer = build_model("logreg", (400,), 300, seed=0)[1]
    bound = 1 / 400**0.5
    assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.99 * bound
    assert abs(layer.weight.std().item() - bound / 3**0.5) < 0.01 * bound


def test_byo_models():
    a = build_model("byo_fixtures:small_net", (4, 10), 3, seed=2)
    assert a(torch.randn(5, 4, 10)).shape == (5, 3)
    assert same_parameters(a, build_model("byo_fixtures:small_net", (4, 10), 3, seed=2))
    assert not same_parameters(a, build_model("byo_fixtures:small_net", (4, 10), 3, seed=9))
    assert build_model("byo_fixtures:fixed_net", (40,), 10, 0)(torch.randn(2, 40)).shape == (2, 10)


@pytest.mark.parametrize(
    "spec, shape, match",
    [
        (
            "resnet50",
            (40,),
            "^model spec 'resnet50': unknown name 'resnet50'; valid: logreg.*cnn1d",
        ),
        ("mlp:abc", (40,), "positive hidden widths"),
        ("mlp:0", (40,), "positive hidden widths"),
        ("mlp:", (40,), "positive hidden widths"),
        (
            "mlp:hidden=64",
            (40,),
            r"^model spec 'mlp:hidden=64': unknown option 'hidden'; valid: none "
            r"\(mlp's widths: e\.g\. mlp:100,100\)$",
        ),
        ("logreg:3", (40,), "no options"),
        ("cnn1d:width=3", (40,), "unknown option 'width'"),
        ("cnn1d:channels=0", (40,), "channels must be >= 1"),
        ("cnn1d", (8,), "too short"),
        ("cnn1d", (2, 3, 40), "input_shape"),
        ("logreg", (), "input_shape"),
        ("byo_fixtures:not_a_module", (40,), "must return a torch.nn.Module"),
        ("byo_fixtures:nothing_here", (40,), "no attribute"),
        ("not_a_real_pkg.models:net", (40,), "cannot import"),
    ],
)
def test_bad_specs(spec, shape, match):
    with pytest.raises(ValueError, match=match) as info:
        build_model(spec, shape, 10, seed=0)
    assert "\n" not in str(info.value)


def test_logreg_learns_synthetic_logreg():
    torch.manual_seed(0)
    data = load_dataset("synthetic_logreg:d=20,classes=4,n=2000", seed=0)
    model = build_model("logreg", data.input_shape, data.num_classes, seed=0)
    batches = Batches(data.x_train, data.y_train, batch_size=64, seed=0)
    for _ in range(12):  # 12 epochs x 25 batches = 300 steps
        for xb, yb in batches:
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            with torch.no_grad():  # plain SGD by hand: torch.optim's first step imports seconds
                for p in model.parameters():
                    p -= 0.5 * p.grad
    with torch.no_grad():
        accuracy = (model(data.x_test).argmax(1) == data.y_test).float().mean().item()
    assert accuracy > 0.8


@pytest.mark.parametrize(
    "model, expected",
    [
        (
            "frozen_net",
            "the model has no trainable parameter (none, or every one has requires_grad=False)",
        ),
        (
            "meta_net",
            "the model has parameters or buffers on the meta device (no data to train); build it "
            "on the CPU",
        ),
        (
            "double_net",
            "cannot run on this dataset's inputs (shape (20,), torch.float32): RuntimeError: ",
        ),
        (
            "wrong_input_net",
            "cannot run on this dataset's inputs (shape (20,), torch.float32): RuntimeError: "
            "mat1 and mat2 shapes cannot be multiplied",
        ),
    ],
)
def test_an_unusable_user_model_is_one_line(tmp_path, capsys, model, expected):
    spec = f"model=reliability_fixtures:{model}"
    errors = every_rank(tiny_config(spec))  # the trainer's own checks
    assert len(set(errors)) == 1 and expected in errors[0] and "\n" not in errors[0], errors
    code, lines = cli(
        ["--config", TINY, "--set", spec, "--set", f"out_dir={tmp_path / 'run'}"], capsys
    )
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: bad value for 'model'")
    assert expected in lines[0]


@pytest.mark.parametrize(
    "spec, shape, parameters",
    [
        # 20 x 1e11 + 1e11 weights and biases, then 1e11 x 4 + 4
        ("mlp:100000000000", (20,), "2,500,000,000,004"),
        # tied embedding 4 x 1e6, LSTM 4h(h + h) + 8h, decoder bias 4
        ("lstm_lm:layers=1,hidden=1000000", (5,), "8,000,012,000,004"),
    ],
)
def test_a_model_larger_than_the_memory_is_named_before_anything_is_allocated(
    spec, shape, parameters
):
    from gossip_powersgd.training.models import build_model

    with pytest.raises(ValueError) as info:
        build_model(spec, shape, 4)
    text = str(info.value)
    assert text.startswith(f"model spec '{spec}' has {parameters} parameters (")
    assert "out of memory" in text and "GB" in text and "\n" not in text


@pytest.mark.parametrize(
    "error, line",
    [
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                "memory: you tried to allocate 8000000000000 bytes. Error code 12 (Cannot "
                "allocate memory)"
            ),
            "out of memory: an allocation of 8000 GB failed",
        ),
        (
            torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
                "15.77 GiB of which 3.12 GiB is free."
            ),
            "out of memory: an allocation of 20.00 GiB failed",
        ),
        (MemoryError(), "out of memory"),
    ],
)
def test_an_allocation_failure_is_one_line_naming_the_size_asked(error, line):
    from gossip_powersgd.launch import EXPECTED_ERRORS, error_line, is_out_of_memory

    text = error_line(error)
    assert text.startswith(line) and "\n" not in text
    assert text.endswith("use a smaller model, batch size or number of peers per machine")
    assert is_out_of_memory(error)
    assert isinstance(error, EXPECTED_ERRORS) or is_out_of_memory(error)  # no traceback


def test_a_huge_model_from_the_command_line_is_one_line(tmp_path, capsys):
    from gossip_powersgd.cli.train import main

    with pytest.raises(SystemExit) as info:
        main(
            [
                "--config",
                str(TINY),
                "--quiet",
                "--set",
                f"out_dir={tmp_path / 'run'}",
                "--set",
                "model=mlp:100000000000",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code != 0 and len(err) == 1, err
    assert err[0].startswith("error: bad value for 'model': model spec 'mlp:100000000000' has ")
