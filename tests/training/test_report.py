"""training/report.py: the run's summary (its table, the mean degree) and each peer's own figures, in
its own table: ``peers/rank-K.md`` beside ``peers/rank-K.json``, written by that peer. Under
differential privacy with private statistics it is where a peer's epsilon is shown as a table (the
run's summary holds no peer's epsilon)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gossip_powersgd.training.data import clear_dataset_cache
from gossip_powersgd.training.report import (
    format_peer_report,
    format_summary,
    peer_report,
)

import paper_fixtures  # tests/support, on sys.path (tests/conftest.py)
from tests.training.test_records import local_train
from tests.training.test_trackers import run_local, tiny


def _rows(markdown: str) -> dict:
    """{quantity: value} of a markdown table of two columns (its header left out)."""
    lines = [line[2:-2] for line in markdown.splitlines() if line.startswith("| ")]
    return dict(line.split(" | ", 1) for line in lines[1:])


def test_each_peer_writes_its_own_epsilon_in_its_own_table(tmp_path):
    config = tiny(tmp_path, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0)
    run_local(config)
    out = Path(config.out_dir)
    summary = (out / "summary.md").read_text()
    epsilons = []
    for rank in range(4):
        peer = json.loads((out / "peers" / f"rank-{rank}.json").read_text())
        table = (out / "peers" / f"rank-{rank}.md").read_text()
        assert table == format_peer_report(peer)
        assert table.startswith(f"# Peer {rank}: its own figures\n")
        rows = _rows(table)
        assert rows["DP ε at δ (the run's accountant)"] == f"{peer['epsilon']:.4g}"
        assert rows["DP ε at δ (PLD, dp-accounting)"] == f"{peer['epsilon_pld']:.4g}"
        assert rows["training samples (its shard)"] == str(peer["shard_size"])
        assert rows["label histogram (classes 0..)"] == " ".join(map(str, peer["label_histogram"]))
        epsilons.append(f"{peer['epsilon']:.4g}")
    # the run's summary names no peer's epsilon while the peers' statistics are private
    assert not any(e in summary for e in epsilons)


def test_a_peer_table_shows_figures_a_feature_adds_under_their_key():
    table = format_peer_report({"rank": 2, "shard_size": 10, "my_figure": 3.5, "epsilon": "inf"})
    rows = _rows(table)
    assert rows == {
        "training samples (its shard)": "10",
        "DP ε at δ (the run's accountant)": "∞ (no noise)",
        "my_figure": "3.5",
    }


def _summary(**changes):
    summary = dict(
        algorithm="exact",
        topology="ring",
        peers=2,
        dataset="mnist1d",
        partition="iid",
        model="mlp",
        parameters=100,
        epochs_done=2,
        steps=10,
        final_test_acc_avg_model=0.5,
        final_test_acc_local_mean=0.25,
        final_test_acc_local_min=None,
        final_test_acc_local_max=0.75,
        final_train_loss=1.5,
        final_consensus_distance=0.01,
        mb_sent_per_peer=1.0,
        exact_gossip_mb_per_peer_formula=2.0,
        exact_gossip_formula="f",
        compression_ratio=None,
        wall_time_s=1.0,
        time_compute_s=0.5,
        time_gossip_compute_s=0.1,
        time_communication_s=0.2,
        label_histogram=[[1, 2, 3], [4, 5, 6]],
    )
    summary.update(changes)
    return summary


def test_format_summary_tables_are_well_formed_with_and_without_histograms():
    """Percentages from fractions, n/a for a missing figure; the markdown tables have as many cells
    in every row as in their header; the histogram has a row per peer and a column per class."""
    text = format_summary(_summary())
    assert "50.00 %" in text and "25.00 % [n/a, 75.00 %]" in text
    assert "exact gossip formula / sent" in text and "classes 0..2" in text
    markdown = format_summary(_summary(), markdown=True)
    for block in markdown.split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        assert len({row.count("|") for row in rows}) <= 1, block
    assert "| 1 | 4 | 5 | 6 |" in markdown
    private = _summary(label_histogram=None, peer_statistics="private: own files")
    del private["label_histogram"]
    text = format_summary(private)
    assert "private: own files" in text and "private (each peer's own file)" in text
    assert "label histogram" not in text


def test_a_language_model_summary_names_its_split_and_has_no_label_histogram(tmp_path):
    """A language model's targets are tokens: no label histogram (not an empty one, 'classes
    0..-1'), summary.md a well-formed table, and evaluated on split=valid its figures say valid,
    not test; the perplexity is in the table."""
    paper_fixtures.write_wikitext2(tmp_path / "data")
    out = tmp_path / "run"
    (summary, *_) = local_train(
        dict(
            topology="ring:2",
            algorithm="exact",
            dataset=f"wikitext2:root={tmp_path / 'data'},bptt=6,split=valid",
            partition="contiguous",
            model="lstm_lm:layers=1,hidden=8",
            lr=1.0,
            batch_size=4,
            epochs=1,
            quiet=True,
            out_dir=str(out),
        )
    )
    assert summary["eval_split"] == "valid"
    text = format_summary(summary)
    assert "averaged-model valid accuracy" in text and "valid perplexity" in text
    assert "test" not in text.replace(str(tmp_path), "")
    assert "0..-1" not in text and "label histogram" in text
    markdown = (out / "summary.md").read_text()
    for block in markdown.split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        assert len({row.count("|") for row in rows}) <= 1, block  # every row has the header's cells
    assert "| peer |" not in markdown
    clear_dataset_cache()


def test_peer_report_holds_this_peers_own_figures():
    class Comm:
        rank = 3

    history = [{"kind": "log", "train_loss_local": 9.0}, {"kind": "eval", "train_loss_local": 0.5}]
    report = peer_report(Comm(), history, torch.tensor([2, 0, 1]), shard_size=3)
    assert report == {
        "rank": 3,
        "shard_size": 3,
        "label_histogram": [2, 0, 1],
        "final_train_loss_local": 0.5,
    }
    assert peer_report(Comm(), [], [], 0)["final_train_loss_local"] is None
