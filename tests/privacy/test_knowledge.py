"""The knowledge-matrix attack (`privacy.knowledge`; El Mrini, Cyffers, Bellet, ICML 2024).

Known answers: which peers an observer's knowledge determines on small graphs, each derived by
hand (ring:4's non-neighbour after two steps; a star's other leaves never, their sum yes; the
3x3 torus's four peers on which an eigenvector of W lives that vanishes on everything the observer
hears; every peer of a line from its end; no non-neighbour's update in decentralized SGD); the
attack on real messages (gossip runs recorded by `ViewRecorder`) reconstructs what the structure
says it determines, to float64 rounding; on PowerGossip only the exactly gossiped tensors are
linearly attackable, and a non-neighbour's are reconstructed as under exact gossip.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy import load_view
from gossip_powersgd.privacy.knowledge import (
    attackable_indices,
    colluders_for_all,
    colluders_needed,
    distances,
    knowledge_matrix,
    observations,
    reach,
    structure_report,
    system_from_views,
)


def determined_peers(system, key="updates"):
    return {p for p, r in reach(system).items() if r[key] == 1.0}


# ---- the structure, against closed forms -----------------------------------------------------------


def test_ring4_averaging_reaches_the_opposite_peer_after_two_steps():
    """Metropolis weights 1/3, gamma 1: after one step observer 0 holds x0, x1, x3; after two,
    y1(1) = (x0 + x1 + x2) / 3 gives x2 = 3 y1(1) - x0 - x1."""
    one = knowledge_matrix("ring:4", 1, [0], gamma=1.0, updates="once")
    assert determined_peers(one) == {0, 1, 3}
    two = knowledge_matrix("ring:4", 2, [0], gamma=1.0, updates="once")
    assert determined_peers(two) == {0, 1, 2, 3}


def test_a_star_leaf_learns_the_centre_and_the_other_leaves_sum_only():
    """star:4 seen from leaf 1, which hears only the centre: swapping leaves 2 and 3 changes
    nothing it receives, so neither is determined, at any step; their sum is."""
    system = knowledge_matrix("star:4", 6, [1], updates="once")
    assert determined_peers(system) == {0, 1}
    assert system.determined(np.array([0.0, 0.0, 1.0, 1.0]))[0]
    assert not system.determined(np.array([0.0, 0.0, 1.0, -1.0]))[0]


def test_the_torus_hides_the_eigenvector_that_vanishes_on_what_the_observer_hears():
    """torus:3x3 (peer 3 r + c), observer 0 hears 1, 2, 3, 6. v = sin(2 pi r / 3) sin(2 pi c / 3)
    is an eigenvector of W that is 0 on row 0 and column 0, so adding it to the values changes no
    message: peers 4, 5, 7, 8 (its support) are not determined, whatever the number of steps."""
    system = knowledge_matrix("torus:3x3", 10, [0], updates="once")
    v = np.array(
        [np.sin(2 * np.pi * r / 3) * np.sin(2 * np.pi * c / 3) for r in range(3) for c in range(3)]
    )
    w = np.asarray(topologies.parse("torus:3x3").W)
    assert np.allclose(w @ v, (v @ w @ v) / (v @ v) * v)  # an eigenvector
    assert np.abs(system.matrix @ v).max() < 1e-12  # invisible in every equation
    assert determined_peers(system) == {0, 1, 2, 3, 6}
    k, group = colluders_needed("torus:3x3", 10, 4, updates="once")
    assert k == 2  # one more colluder off the mode's zero set


def test_a_line_is_read_entirely_from_its_end():
    system = knowledge_matrix(topologies.grid(1, 6), 8, [0], updates="once")
    assert determined_peers(system) == set(range(6))


def test_decentralized_sgd_hides_every_non_neighbours_update_unless_updates_are_tied():
    """With a fresh update per peer and step, each value a non-neighbour sends reaches the
    observer mixed with a neighbour's newer, unknown update: none of its updates (or models) is
    determined; the neighbours' models are (received as they are). Updates tied over windows
    (the paper's assumption for D-GD) determine every peer of the ring."""
    for spec in ("ring:8", "exponential:8"):
        system = knowledge_matrix(spec, 8, [0])
        neighbours = set(topologies.parse(spec).neighbors(0))
        reached = reach(system)
        for peer in set(range(8)) - neighbours - {0}:
            assert reached[peer]["updates"] == 0.0 and reached[peer]["models"] == 0.0
        assert all(reached[p]["models"] == 1.0 for p in neighbours)
        assert colluders_needed(spec, 8, 4, most=2) == (None, ())
    tied = knowledge_matrix("ring:8", 8, [0], gamma=1.0, tie=4)
    assert determined_peers(tied) == set(range(8))


def test_distances_on_a_ring_and_a_torus():
    assert distances("ring:6") == [0, 1, 2, 3, 2, 1]
    assert distances("torus:3x3") == [0, 1, 1, 1, 2, 2, 1, 2, 2]
    assert distances("ring:6", source=2) == [2, 1, 0, 1, 2, 3]


def test_one_peer_determines_everyone_on_a_ring_once_the_steps_carry_the_values_to_it():
    """ring:6 averaging: after one step peer 0 holds only its neighbours' values (no single
    colluder determines everyone, and none off the opposite peer's neighbourhood its value);
    after three, peer 0 alone determines everyone."""
    assert colluders_for_all("ring:6", 1, updates="once", most=1) == (None, ())
    assert colluders_needed("ring:6", 1, 3, updates="once", most=1) == (None, ())
    assert colluders_for_all("ring:6", 3, updates="once") == (1, (0,))
    assert colluders_needed("ring:6", 3, 3, updates="once") == (1, (0,))


def test_on_a_schedule_no_colluder_is_a_peer_paired_with_the_target_at_any_step():
    """one_peer_exponential:8 pairs 7 with 6, 5 and 3 at steps 0, 1 and 2 (7 XOR 1, 2, 4): all
    three hear 7's values as sent. In D-SGD over those steps 3 hears y_7(2) and 5 heard y_7(1)
    and holds its own y_5(1), the two values 7 mixed before it, so 3 and 5 together determine
    7's last update. Only step 0's neighbour was left out, so (2, (3, 5)) came back, two of 7's
    neighbours; now every step's are, and no set of at most 3 of the others determines one."""
    schedule = topologies.parse("one_peer_exponential:8")
    paired = {j for t in range(3) for j in schedule.at(t).neighbors(7)}
    assert paired == {3, 5, 6}
    system = knowledge_matrix(schedule, 3, [3, 5])
    assert system.determined(np.eye(len(system.unknowns))[system.unknowns.index((2, 7))])[0]
    assert colluders_needed(schedule, 3, 7) == (None, ())


def test_the_structure_report_counts_what_peer_0_determines_at_each_distance():
    """ring:6 averaging after 3 steps: every peer at every distance is determined (both
    neighbours, both at distance 2, the opposite peer), so is every model; the farthest peer is
    3 and peer 0 alone suffices for it and for everyone. D-SGD with a fresh update per step on
    the same ring: the neighbours' models are received as they are, no farther unknown is
    determined (all partly measured)."""
    once = structure_report("ring:6", 3, updates="once", most=2)
    assert once["updates_by_distance"] == {"1": [2, 2], "2": [2, 2], "3": [1, 1]}
    assert once["models_by_distance"] == once["updates_by_distance"]
    assert (once["target"], once["target_distance"], once["peers"], once["neighbours"]) == (
        3,
        3,
        6,
        2,
    )
    assert (once["colluders_for_target"], once["colluder_set_for_target"]) == (1, [0])
    assert (once["colluders_for_all"], once["colluder_set_for_all"]) == (1, [0])
    assert once["unknowns"] == 6 and once["rank"] == 6
    fresh = structure_report("ring:6", 4, most=1)
    assert fresh["models_by_distance"]["1"] == [2, 2]
    assert fresh["updates_by_distance"]["2"][0] == fresh["updates_by_distance"]["3"][0] == 0
    assert fresh["colluders_for_target"] is None and fresh["unknowns"] == 6 * 4


# ---- on real messages ------------------------------------------------------------------------------

SHAPES = [(6, 6), (5,)]  # a matrix PowerGossip compresses, a vector it gossips exactly


def _gossip(comm, spec, steps, constant_updates):
    """Every peer gossips private float64 values and records its view: averaging (values once),
    or with `constant_updates` the same private update added before every step."""
    from gossip_powersgd.algorithms import make_algorithm
    from gossip_powersgd.privacy.views import ViewRecorder

    g = torch.Generator().manual_seed(100 + comm.rank)
    x = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
    updates = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
    algorithm = make_algorithm(spec, x, comm)
    recorder = ViewRecorder(algorithm)
    for step in range(steps):
        if constant_updates or step == 0:
            for t, u in zip(x, updates):
                t.add_(u)
        algorithm.step()
        recorder.flush()
    return recorder, [u.clone() for u in updates]


def run(spec, topology, steps, constant_updates=False):
    results = LocalCluster(topologies.parse(topology), timeout=60).run(
        _gossip, spec, steps, constant_updates
    )
    views = {k: load_view(recorder) for k, (recorder, _) in enumerate(results)}
    return views, [updates for _, updates in results]


def flat(tensors, indices):
    return torch.cat([tensors[k].reshape(-1) for k in indices]).numpy()


def test_exact_gossip_averaging_gives_away_the_opposite_peers_value():
    views, private = run("exact:gamma=1.0", "ring:4", 2)
    observer = {0: views[0]}
    indices = attackable_indices(views[0])
    assert indices == [0, 1]
    system = system_from_views(observer, "ring:4", gamma=1.0, updates="once")
    solution = system.solve(
        observations(system, observer, [torch.zeros(s) for s in SHAPES], indices)
    )
    for peer in range(4):
        column = system.unknowns.index((0, peer))
        # float64 messages; the solve is well conditioned (a 3 x 3 system): 1e-12
        assert np.allclose(solution[column], flat(private[peer], indices), atol=1e-12)
    # the hand formula, on the messages themselves
    received = {(m["step"], m["sender"]): m["tensor"] for m in views[0].messages_from(1)}
    own = views[0].own_trajectory()[0]
    x2 = 3 * received[(1, 1)] - torch.cat([t.reshape(-1) for t in own]) - received[(0, 1)]
    assert torch.allclose(x2, torch.cat([u.reshape(-1) for u in private[2]]), atol=1e-12)


def test_tied_updates_of_every_ring_peer_are_recovered_from_one_observers_messages():
    """Exact gossip on ring:8 where every peer adds its own constant update before each of 8
    steps (the paper's D-GD assumption holding exactly): observer 0 recovers all eight."""
    views, private = run("exact:gamma=1.0", "ring:8", 8, constant_updates=True)
    observer = {0: views[0]}
    system = system_from_views(observer, "ring:8", gamma=1.0, tie=8)
    solution = system.solve(
        observations(system, observer, [torch.zeros(s) for s in SHAPES], [0, 1])
    )
    for peer in range(8):
        assert np.allclose(
            solution[system.unknowns.index((0, peer))], flat(private[peer], [0, 1]), atol=1e-9
        )


def test_powergossip_exposes_only_its_exactly_gossiped_tensors_to_the_linear_attack():
    """PowerGossip rank 1 on ring:4, values gossiped once: the observer's messages carry the
    vector exactly (its knowledge then determines the opposite peer's vector, as exact gossip's
    does) and the matrix only as products with factors of its own edges; the non-neighbour's
    matrix enters no equation with known coefficients. Low-rank messages shrink what a
    non-neighbour loses to the linear attack to the exactly gossiped coordinates: 5 of 41."""
    spec = "powergossip:rank=1,min_compression_rate=0,gamma=1.0"
    views, private = run(spec, "ring:4", 3)
    observer = {0: views[0]}
    indices = attackable_indices(views[0])
    assert indices == [1]
    system = system_from_views(observer, "ring:4", gamma=1.0, updates="once")
    assert determined_peers(system) == {0, 1, 2, 3}
    solution = system.solve(
        observations(system, observer, [torch.zeros(s) for s in SHAPES], indices)
    )
    assert np.allclose(solution[system.unknowns.index((0, 2))], flat(private[2], [1]), atol=1e-12)
    sizes = [int(np.prod(s)) for s in SHAPES]
    assert sum(sizes[k] for k in indices) / sum(sizes) == pytest.approx(5 / 41)
