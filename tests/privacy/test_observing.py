"""`privacy.observing`: the `observers` / `observe_every` config keys — flat or nested, one rank
without brackets, bad values refused in one line, and left out of the checkpoint's config hash
(recording changes no bit of the run); the hook they turn on and its summary row."""

from __future__ import annotations

import pytest

from gossip_powersgd.privacy.observing import observer_hook, observer_summary_rows
from gossip_powersgd.training.config import config_from_dict, config_hash
from gossip_powersgd.training.report import format_summary
from tests.privacy.test_views import tiny, train_everywhere


def test_the_nested_spelling_is_the_flat_one():
    nested = config_from_dict({"observe": {"ranks": [3, 1], "every": 2}})
    flat = config_from_dict({"observers": [3, 1], "observe_every": 2})
    assert nested == flat
    assert (nested.observers, nested.observe_every) == ([3, 1], 2)
    assert config_from_dict({}).observers == [] and config_from_dict({}).observe_every == 1


@pytest.mark.parametrize("value", [True, [1, 2.0], "3", [[1]]])
def test_a_value_that_is_not_a_list_of_rank_integers_is_refused(value):
    """A bool is an int to Python but not a rank; a float or a string rank is refused, not cast."""
    with pytest.raises(ValueError, match="is not a list of ranks") as info:
        config_from_dict({"observers": value})
    assert "\n" not in str(info.value)


def test_observers_leave_the_config_hash_unchanged_and_other_keys_do_not():
    plain = config_from_dict({"lr": 0.1})
    observed = config_from_dict({"lr": 0.1, "observers": [0, 2], "observe_every": 5})
    assert config_hash(observed) == config_hash(plain)
    assert config_hash(config_from_dict({"lr": 0.2})) != config_hash(plain)


def test_bad_observer_values_are_one_line_errors():
    for override, message in [
        ("observers=[-1]", "must be distinct ranks >= 0"),
        ("observers=[1, 1]", "must be distinct ranks >= 0"),
        ("observers=three", "is not a list of ranks"),
        ("observe_every=0", "'observe_every': 0 (must be >= 1"),
        ("observe_every=5", "observe_every is for observers (the ranks whose messages are"),
    ]:
        with pytest.raises(
            ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
        ) as info:
            tiny(override)
        assert "\n" not in str(info.value)
    assert tiny("observers=2").observers == [2]  # one rank needs no brackets
    with pytest.raises(ValueError, match=r"observers \[7\] are not ranks of this 4-peer run"):
        train_everywhere(tiny("observers=[7]"))


def test_observer_hook_and_summary_rows():
    assert observer_hook(tiny()) is None
    hook = observer_hook(tiny("observers=[3, 1]", "observe_every=2"))
    assert hook.observers == [1, 3] and hook.observe_every == 2
    assert observer_summary_rows({}) == []
    rows = observer_summary_rows(
        {"observers": [1, 3], "observe_every": 2, "observed_bytes": [0, 2_000_000, 0, 500_000]}
    )
    assert rows == [
        ("observed message MB (every 2 step(s))", "2.500 (rank 1: 2.000, rank 3: 0.500)")
    ]


def test_the_summary_table_shows_the_recorded_bytes():
    summary = train_everywhere(tiny("observers=[0]"))[0]
    assert "observed message MB (every 1 step(s))" in format_summary(summary)
