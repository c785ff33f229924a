"""experiments/pages/privacy_knowledge/page.py: the low-rank answer counts the parameters given away."""

from __future__ import annotations

from experiments.pages.privacy_knowledge.page import _summaries, low_rank_answer


def test_the_low_rank_answer_counts_the_parameters_given_away(attack_rows):
    summaries = [s for key in attack_rows for s in _summaries(attack_rows[key])]
    lines = low_rank_answer(summaries)
    exact = next(line for line in lines if "exact gossip" in line)
    pg = next(line for line in lines if "PowerGossip r1" in line)
    assert "reconstructs 27 of the 27 parameters" in exact
    assert "reconstructs 3 of the 27 parameters" in pg and "no better than" in pg
