"""Each peer's own figures, in its own table: ``peers/rank-K.md`` beside ``peers/rank-K.json``,
written by that peer. Under differential privacy with private statistics it is where a peer's
epsilon is shown as a table (the run's summary holds no peer's epsilon)."""

from __future__ import annotations

import json
from pathlib import Path

from gossip_powersgd.training.report import format_peer_report
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
