"""`membership.epochs`: the agreed sequence of membership epochs — checked appends, the epoch in
force at a step, each peer's absences, a plain-value state that rebuilds the same epochs, and the
repaired graphs, built once per membership and kept for the last few."""

from __future__ import annotations

import pytest

import topologies
from gossip_powersgd.membership.epochs import CACHED_GRAPHS, Membership

#: Peer 3 leaves at 4, peer 5 at 7, peer 3 is back at 12: the absences are known by hand.
SCHEDULE = [(4, [0, 1, 2, 4, 5, 6, 7]), (7, [0, 1, 2, 4, 6, 7]), (12, [0, 1, 2, 3, 4, 6, 7])]


def test_the_epoch_in_force_changes_at_the_step_a_change_takes_effect():
    membership = Membership(topologies.ring(8), SCHEDULE)
    assert [(e.number, e.step) for e in membership.epochs] == [(0, 0), (1, 4), (2, 7), (3, 12)]
    expected = [0] * 4 + [1] * 3 + [2] * 5 + [3] * 4  # steps 0..15
    assert [membership.at(t).number for t in range(16)] == expected
    assert membership.at(10**6) is membership.last
    assert 3 not in membership.at(11) and 3 in membership.at(12)


def test_absences_are_the_spans_a_peer_is_away():
    membership = Membership(topologies.ring(8), SCHEDULE)
    assert membership.absences(3) == [(4, 12)]
    assert membership.absences(5) == [(7, None)]  # never back
    assert membership.absences(0) == []
    membership.append(20, [0, 1, 2, 4, 6, 7])  # peer 3 leaves a second time
    assert membership.absences(3) == [(4, 12), (20, None)]


def test_the_state_dict_rebuilds_the_same_epochs():
    membership = Membership(topologies.ring(8), SCHEDULE)
    state = membership.state_dict()
    assert state == {"epochs": [[s, live] for s, live in SCHEDULE]}
    assert Membership(topologies.ring(8), state["epochs"]).epochs == membership.epochs


def test_epoch_zero_gossips_on_the_topology_and_a_changed_one_on_its_repaired_graph():
    ring = topologies.ring(8)
    membership = Membership(ring, SCHEDULE)
    first, left = membership.epochs[0], membership.epochs[1]
    assert membership.graph(first) is ring
    graph = membership.graph(left)
    assert graph is membership.graph(left)  # built once
    assert graph == topologies.repair(ring, left.live)  # of the epoch's live peers
    assert list(graph.at(0).neighbors(3)) == []  # the peer that left is isolated


def test_only_the_last_few_repaired_graphs_are_kept():
    """Each repaired graph holds a dense n x n W: after CACHED_GRAPHS more memberships the first
    is built anew (an equal graph, a new object); the most recent ones are the same objects."""
    membership = Membership(topologies.complete(12))
    first = membership.append(1, range(1, 12))
    kept = membership.graph(first)
    for k in range(CACHED_GRAPHS):  # CACHED_GRAPHS further memberships: peer 0 back, another out
        membership.append(2 + k, [i for i in range(12) if i != 2 + k % 10])
    last = membership.last
    assert membership.graph(last) is membership.graph(last)
    rebuilt = membership.graph(first)
    assert rebuilt is not kept and rebuilt.at(0) == kept.at(0)


def test_membership_appends_are_checked():
    membership = Membership(topologies.ring(4))
    membership.append(5, [0, 1, 2])
    for step, live, problem in [
        (5, [0, 1], "does not come after the last one"),
        (9, [0, 7], "peer 7 is not a peer of 'ring:4'"),
        (9, [], "no peer would be left"),
        (9, [0, 1, 2], "the same as before"),
    ]:
        with pytest.raises(ValueError, match=problem):
            membership.append(step, live)
    assert membership.state_dict() == {"epochs": [[5, [0, 1, 2]]]}
