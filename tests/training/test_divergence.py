"""Divergence (training/divergence.py): a finite divergence stops every rank with one line; a
growing consensus distance is divergence too."""

import json
import math

import pytest

import topologies
from gossip_powersgd import (
    LocalCluster,
    NonFiniteError,
)
from gossip_powersgd.training import trainer as trainer_module
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train
from tests.algorithms.test_base import watch_received
from tests.conftest import (
    TINY,
    cli,
)


def test_finite_divergence_stops_every_rank_with_one_line(tmp_path, capsys):
    """lr=1e9 gives a training loss of ~1e9, finite, which used to end as a successful run."""
    out = tmp_path / "run"
    code, lines = cli(["--config", TINY, "--set", "lr=1e9", "--set", f"out_dir={out}"], capsys)
    assert code != 0
    assert lines == [
        "error: the run diverged: the training loss is 1.36e+08 at step 5, more than "
        "1e+06 x ln(4) (a uniform guess's loss); lower the learning rate (or the "
        "algorithm's gamma)"
    ], lines
    # the record that diverged is written first (by at least the rank that stopped first: the
    # others may be released from a collective by its failure before they write)
    last = [
        json.loads(lines[-1])
        for lines in (p.read_text().splitlines() for p in (out / "metrics").glob("rank-*.jsonl"))
        if lines
    ]
    assert last and all(r["train_loss"] > 1e6 * math.log(4) for r in last)
    assert not (out / "summary.json").exists()


def test_a_growing_consensus_distance_is_divergence():
    history = [{"kind": "log", "step": 5, "train_loss": 1.0, "consensus_distance": 0.01}]
    trainer_module.check_divergence(dict(history[0], step=10, consensus_distance=9e5), history, 4)
    with pytest.raises(
        NonFiniteError,
        match=r"^the run diverged: the consensus distance is 2e\+06 "
        r"at step 10, more than 1e\+06 x max\(1, its first",
    ):
        trainer_module.check_divergence(
            dict(history[0], step=10, consensus_distance=2e6), history, 4
        )


def test_a_diverging_training_run_names_the_rank_and_sends_nothing_non_finite():
    log = {}
    config = load_config(TINY, ["lr=1e38", "quiet=true"], deep=False)

    def peer(comm):
        watch_received(comm, log)
        return train(comm, config)

    with pytest.raises(
        NonFiniteError,
        match=r"^rank [0-3]: the training loss is (inf|nan) at step \d+ "
        r"\(lower the learning rate",
    ):
        LocalCluster(topologies.parse(config.topology), timeout=30).run(peer)
    assert log == {}
