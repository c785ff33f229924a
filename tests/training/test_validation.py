"""Reliability IV, numeric limits: values far beyond what a run can use are clamped with one
warning line naming the value the run uses, or refused in one line; never a silent no-op, never a
hang. (tiny.yaml: 1600 training samples on 4 peers, 13 steps per epoch, 3 epochs; logreg 20 x 4.)"""

from __future__ import annotations

import time

import pytest
import torch

from gossip_powersgd.training.config import load_config
from gossip_powersgd.utils import RunWarning

from tests.conftest import ROOT, errors_on_every_rank

TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
HUGE = 10**12


def tiny(*overrides, deep=False):
    return load_config(TINY, ["quiet=true", *overrides], deep=deep)


def train_cli(tmp_path, *sets):
    """gossip-train --config tiny in this process: its summary."""
    from gossip_powersgd.cli.train import run

    argv = ["--config", str(TINY), "--quiet", "--set", f"out_dir={tmp_path / 'run'}"]
    for item in sets:
        argv += ["--set", item]
    return run(argv)


def test_local_steps_beyond_the_runs_steps_is_refused_on_every_rank():
    """local_steps 100 with 3 x 13 = 39 steps: no communication round would ever happen."""
    errors = errors_on_every_rank(tiny("local_steps=100"))
    assert len(set(errors)) == 1, errors
    assert errors[0] == (
        "ValueError: local_steps 100 exceeds the run's 39 optimizer steps (3 epochs of 13): the "
        "peers would never communicate; set local_steps to at most 39"
    )


@pytest.mark.parametrize(
    "key, words",
    [
        (
            "eval_every",
            "eval_every 1000000000000 exceeds epochs (3): the run evaluates at its end "
            "only (as with eval_every: 3)",
        ),
        (
            "checkpoint_every",
            "checkpoint_every 1000000000000 exceeds epochs (3): the run writes "
            "its checkpoint at its end only (as with checkpoint_every: 3)",
        ),
        (
            "batch_size",
            "batch_size 1000000000000 exceeds the peers' shards (400 training samples "
            "each on average): each step takes a peer's whole shard, an effective batch size of "
            "about 400",
        ),
    ],
)
def test_an_every_or_a_batch_far_beyond_the_run_is_clamped_with_one_warning(tmp_path, key, words):
    with pytest.warns(RunWarning) as caught:
        summary = train_cli(tmp_path, f"{key}={HUGE}")
    assert [str(w.message) for w in caught if w.category is RunWarning] == [words]
    assert summary["epochs"] == 3 and summary["final_test_acc_avg_model"] > 0.25


def test_powergossip_rank_above_every_matrix_is_named_with_the_rank_it_takes(tmp_path):
    with pytest.warns(RunWarning) as caught:
        summary = train_cli(tmp_path, f"algorithm=powergossip:rank={HUGE}")
    (message,) = [str(w.message) for w in caught if w.category is RunWarning]
    assert message.startswith(
        f"powergossip: rank {HUGE} exceeds the smaller side of every parameter matrix (at most 4)"
    )
    assert "at rank min(rank, rows, cols)" in message
    assert summary["final_test_acc_avg_model"] > 0.25


def test_epochs_beyond_any_run_are_refused_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"bad value for 'epochs': 10{21}.*at most 2\*\*53"):
        tiny("epochs=1000000000000000000000")
    assert time.perf_counter() - start < 30  # the check needs no data (not: a minutes-long hang)


def test_threads_beyond_the_cpus_are_clamped_with_one_warning(tmp_path):
    import os

    cpus = len(os.sched_getaffinity(0))
    try:
        with pytest.warns(RunWarning) as caught:
            train_cli(tmp_path, "threads=100000", "epochs=1")
        assert torch.get_num_threads() == cpus
    finally:
        torch.set_num_threads(1)
    (message,) = [str(w.message) for w in caught if w.category is RunWarning]
    assert message == (
        f"threads 100000 exceeds the {cpus} CPUs this process may use: using {cpus} (torch "
        "intra-op threads)"
    )


# ---- out of memory, named as such with the size asked --------------------------------------------


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
