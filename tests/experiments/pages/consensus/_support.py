"""Helpers of the consensus page's test files (tests/experiments/pages/consensus/test_*.py): the
tiny problem, and one instance run and drawn from its stored row."""

from __future__ import annotations

import json

import torch

from experiments.engine import Record, Run
from experiments.pages import consensus as page
from experiments.pages.consensus import instance

torch.set_num_threads(1)


TINY = "matrix:20"


def _instance(tmp_path, problem, algorithms, reseed, seeds, budgets=(1e4, 3e4)):
    config = dict(
        topology="ring:4", problem=problem, algorithms=algorithms, reseed=reseed, seeds=list(seeds)
    )
    config.update(gammas=[0.1, 1.0], budgets=list(budgets), dtype="float64", stop_relative=1e-12)
    row = json.loads(
        json.dumps(instance.run_instance(**config, models_dir=str(tmp_path)))
    )  # as stored
    run = Run(f"ring:4/{problem}", config)
    record = Record(
        run.key, **run.identity(), quick=True, row=row, commit="c", finished="f", seconds=1.0
    )
    return row, page.load_instance(record, "cmd")
