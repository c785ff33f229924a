"""experiments/pages/bandwidth/text.py: rates and durations as the page writes them, and the answer in
words from the numbers."""

from __future__ import annotations

from experiments.pages.bandwidth import figures, recipe, text
from experiments.pages.bandwidth.text import answer


def test_rates_and_durations_read_as_written():
    assert figures.rate_bits("1gbit") == 1e9 and figures.rate_bits("10mbit") == 1e7
    assert text.rate_text("100mbit") == "100 Mbit/s"
    assert [text.seconds_text(s) for s in (0.84, 90, 7200, 3 * 86400)] == [
        "0.84 s",
        "1.5 min",
        "2 h",
        "3 d",
    ]


RATES = ("1gbit", "100mbit", "10mbit", "1mbit")


TIMES = {
    "1gbit": {"pg-r1": 10.0, "exact": 5.0, "allreduce": 4.0},
    "100mbit": {"pg-r1": 10.0, "exact": 20.0, "allreduce": 12.0},
    "10mbit": {"pg-r1": 11.0, "exact": 200.0, "allreduce": 120.0},
    "1mbit": {"pg-r1": 20.0, "exact": None, "allreduce": 1200.0},
}


def test_the_answer_names_the_rates_and_factors_computed_from_the_times():
    line = text.compare_line(TIMES, RATES)  # PowerGossip r1 against exact gossip
    assert line == (
        "PowerGossip r1 reaches it before exact gossip at 100 Mbit/s (2× sooner), 10 Mbit/s "
        "(18.2× sooner), 1 Mbit/s (exact gossip never reaches it) and not at 1 Gbit/s "
        "(exact gossip 2× sooner)."
    )
    assert text.fastest(TIMES["1gbit"]) == "allreduce"


def _timed(per_rate):
    """figures.times' shape for ring:8 from {rate: {algorithm: seconds}}."""
    cells = {}
    for rate, per in per_rate.items():
        cells[rate] = {
            k: {f: {"mean": v} for f in ("core_each", "measured", "core_each_with_evals")}
            for k, v in per.items()
        }
    return {"ring:8": cells}


def test_the_answer_section_is_drawn_from_the_core_each_figure():
    s = recipe.FULL
    lines = answer(s, _timed(TIMES), 0.75)
    assert lines[0].startswith("**ring:8**, to 75 %, hosts with a core each (training time): ")
    assert "before exact gossip at 100 Mbit/s (2× sooner)" in lines[0]
    assert "before all-reduce at 100 Mbit/s (1.2× sooner)" in lines[0]
    assert lines[1] == (
        "Fastest to 75 % at each rate (ring:8, core each): 1 Gbit/s: all-reduce, 100 Mbit/s: "
        "PowerGossip r1, 10 Mbit/s: PowerGossip r1, 1 Mbit/s: PowerGossip r1."
    )
    assert lines[2].endswith("the same verdicts.")
