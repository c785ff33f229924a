"""The churn schedule's grammar (one line per bad spec) and the membership epochs it makes."""

from __future__ import annotations

import numpy as np
import pytest

import topologies
from gossip_powersgd.membership.churn import churn_membership, parse_churn, schedule_figures
from gossip_powersgd.membership.epochs import Membership


def test_events_make_the_epochs_they_say():
    membership = churn_membership("leave:3@200,leave:5@200,join:3@400", topologies.ring(8), 1000)
    assert [(e.number, e.step, e.live) for e in membership.epochs] == [
        (0, 0, tuple(range(8))),
        (1, 200, (0, 1, 2, 4, 6, 7)),
        (2, 400, (0, 1, 2, 3, 4, 6, 7)),
    ]
    assert membership.at(199).number == 0 and membership.at(200).number == 1
    assert membership.at(10**6).number == 2
    assert membership.absences(3) == [(200, 400)] and membership.absences(5) == [(200, None)]
    assert membership.graph(membership.epochs[0]) is membership.topology
    assert set(membership.graph(membership.at(300)).static.edges()) >= {(2, 4), (4, 6)}


def test_random_churn_is_a_pure_function_of_seed_and_step():
    schedule = parse_churn("rate=0.05,down=20,seed=3", 16)
    first = schedule.changes(16, 2000)
    assert first == parse_churn("rate=0.05,down=20,seed=3").changes(16, 2000)
    assert first != parse_churn("rate=0.05,down=20,seed=4").changes(16, 2000)
    # every leave comes back exactly `down` steps later (or after the run)
    membership = Membership(topologies.ring(16), first)
    spans = [s for k in range(16) for s in membership.absences(k)]
    assert spans and all(back is None or back - left == 20 for left, back in spans)
    # leaves per live peer-step near the rate: binomial, 5 standard deviations
    leaves = sum(1 for _ in spans)
    exposure = sum(len(membership.at(t).live) for t in range(1, 2000))
    p = 0.05
    assert abs(leaves - p * exposure) < 5 * np.sqrt(exposure * p * (1 - p))


def test_random_churn_never_empties_the_membership():
    changes = parse_churn("rate=0.9,down=5,seed=0").changes(3, 300)
    assert all(len(live) >= 1 for _, live in changes)
    assert any(len(live) == 1 for _, live in changes)  # the rule was needed


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("leave:9@2", r"peer 9 is not one of the run's 8 \(ids 0\.\.7\)"),
        ("leave:x@2", r"peer 'x' is not a whole number"),
        ("join:3@4", r"join:3@4 comes before peer 3 left"),
        ("leave:3@5,join:3@4", r"join:3@4 comes before peer 3 left"),
        ("leave:3@-1", r"step -1 is negative"),
        ("leave:3@0", r"step 0 is the start"),
        ("leave:3@1.5", r"step '1\.5' is not a whole number"),
        ("lave:3@3", r"unknown name 'lave'; valid: leave, join"),
        ("leave:3", r"event 'leave:3' is not leave:PEER@STEP"),
        ("leave:3@5,leave:3@8", r"peer 3 already left at step 5 and has not joined since"),
        ("leave:3@5,join:3@5", r"peer 3 has two events at step 5"),
        (",".join(f"leave:{k}@5" for k in range(8)), r"at step 5 every peer has left"),
        (
            ",".join(["leave:0@2", *(f"leave:{k}@5" for k in range(1, 8)), "join:0@5"]),
            r"every member leaves while peers \[0\] join",
        ),
        ("leave:3@5,,join:3@9", r"empty item"),
        ("leave:3@5,rate=0.1", r"give either events .* or random churn"),
        ("rate=1.5,down=3", r"rate=1\.5 must be in \[0, 1\)"),
        ("rate=-0.1,down=3", r"rate=-0\.1 must be in \[0, 1\)"),
        ("rate=x,down=3", r"rate 'x' is not a number"),
        ("rate=0.1", r"random churn needs down=D"),
        ("down=3", r"random churn needs rate=R"),
        ("rate=0.1,down=0", r"down 0 must be >= 1"),
        ("rate=0.1,down=2,seed=-1", r"seed -1 must be >= 0"),
        ("rate=0.1,down=2,x=1", r"unknown option 'x'; valid: rate, down, seed"),
        ("", r"churn spec must be a non-empty string"),
    ],
)
def test_bad_specs_are_one_line_naming_the_problem(spec, problem):
    with pytest.raises(ValueError, match=problem) as info:
        parse_churn(spec, 8)
    text = str(info.value)
    assert "\n" not in text
    assert not spec or text.startswith(f"churn spec {spec!r}: ")


def test_an_event_past_the_run_is_refused_with_the_run_length():
    with pytest.raises(ValueError, match=r"leave:3@900 is past the run's last step 599"):
        parse_churn("leave:3@900", 8).changes(8, 600)


def test_schedule_figures_count_departures_returns_and_time_away():
    """The figures follow the events, and a schedule object gives the same as its spec."""
    # 4 peers, 10 steps: peer 1 away for steps 2..5 (4 steps), peer 3 from step 6 to the end (4)
    figures = schedule_figures("leave:1@2,join:1@6,leave:3@6", 4, 10)
    assert figures == {
        "departures": 2,
        "returns": 1,
        "scheduled_changes": 2,
        "away_share": 8 / 40,
    }
    assert schedule_figures(parse_churn("leave:1@2,join:1@6,leave:3@6", 4), 4, 10) == figures


def test_random_churn_figures_agree_with_its_membership():
    """Random churn: as many scheduled changes as the membership has epochs after the first, as
    many returns as departures minus the peers away at the end."""
    spec, size, steps = "rate=0.05,down=5,seed=3", 8, 200
    figures = schedule_figures(spec, size, steps)
    membership = churn_membership(spec, topologies.parse("ring:8"), steps)
    assert figures["scheduled_changes"] == len(membership.epochs) - 1 > 0
    away_at_end = size - len(membership.epochs[-1].live)
    assert figures["returns"] == figures["departures"] - away_at_end
    assert 0.0 < figures["away_share"] < 1.0
