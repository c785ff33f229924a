"""`membership.algorithm`: the gossip algorithm rebuilt at each membership change — both ends of
every edge hold the same PowerGossip factors through the changes, a kept edge keeps its warm
factors and a new one starts from its seed, the centralized baselines refuse churn, a given gamma
is checked against every epoch's graph, and `MemberAlgorithm` keeps the timers of every instance
and refuses a state of another epoch."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, make_algorithm
from gossip_powersgd.comm.membership import MemberCommunicator
from gossip_powersgd.errors import PeerLostError
from gossip_powersgd.membership.algorithm import (
    MemberAlgorithm,
    check_every_epoch,
    refuse_unsupported,
)
from gossip_powersgd.membership.churn import churn_membership
from gossip_powersgd.membership.peer import ParamsState, PeerMembership
from membership_fixtures import CHURN, STEPS, peer_tensors


def factors_after_changes(comm, topology):
    params = peer_tensors(comm, torch.float64)
    member = MemberCommunicator(comm)
    peer = PeerMembership(member, churn_membership(CHURN, topology, STEPS))
    algorithm = peer.bind(
        "powergossip:rank=2", make_algorithm("powergossip:rank=2", params, member)
    )
    state, out = ParamsState(params), {}
    for t in range(STEPS):
        peer.advance(t, state)
        if peer.live:
            algorithm.step()
            inner = algorithm.inner
            out[t] = {
                j: {k: v.clone() for k, v in inner.factors(j).items()} for j in member.neighbors
            }
    return out


def test_both_ends_of_every_edge_hold_the_same_factors_through_the_changes():
    topology = topologies.torus(2, 4)
    results = LocalCluster(topology).run(factors_after_changes, topology)
    checked = 0
    for i, steps in enumerate(results):
        for t, edges in steps.items():
            for j, mine in edges.items():
                theirs = results[j][t][i]
                assert all(torch.equal(mine[k], theirs[k]) for k in mine), (i, j, t)
                checked += 1
    assert checked > 300


def test_a_kept_edge_keeps_its_factors_and_a_new_one_starts_from_its_seed():
    """Peer 3 leaves ring:8 at step 4: edge 1-2 stays (its warm factors go on), edge 2-4 is new
    (its factor is drawn from the generator of (seed, 2, 4), as at the start of a run)."""
    from gossip_powersgd.algorithms.powergossip import edge_seed

    topology = topologies.ring(8)

    def peer(comm):
        params = peer_tensors(comm, torch.float64)
        member = MemberCommunicator(comm)
        membership = churn_membership("leave:3@4", topology, 6)
        p = PeerMembership(member, membership)
        algorithm = p.bind(
            "powergossip:rank=1", make_algorithm("powergossip:rank=1", params, member)
        )
        kept = fresh = None
        for t in range(6):
            if t == 4 and comm.rank == 2:
                kept = {k: v.clone() for k, v in algorithm.inner.factors(1).items()}
            p.advance(t, ParamsState(params))
            if t == 4 and comm.rank == 2:
                after = algorithm.inner.factors(1)
                assert all(torch.equal(after[k], kept[k]) for k in kept)
                fresh = algorithm.inner.factors(4)["0.Q"].clone()
                assert algorithm.inner.edges.counters[4] == 0
                assert algorithm.inner.edges.counters[1] == 4
            if p.live:
                algorithm.step()
        return fresh

    fresh = LocalCluster(topology).run(peer)[2]
    g = torch.Generator().manual_seed(edge_seed(0, 2, 4))
    assert torch.equal(
        fresh.transpose(1, 2), torch.randn((1, 1, 12), generator=g, dtype=torch.float64)
    )


@pytest.mark.parametrize("spec", ["allreduce", "powersgd:rank=1"])
def test_centralized_baselines_refuse_churn(spec):
    with pytest.raises(ValueError, match="cannot go on after peers leave or join.*fail-stop"):
        refuse_unsupported(spec)


def test_a_gamma_given_in_the_spec_is_checked_against_every_epochs_graph():
    """ring:9's stable range is (0, 1.547); without peer 3 (its repaired graph) it is (0, 1.5):
    gamma 1.52 holds at the start and is refused for the change, naming its step."""
    ring = topologies.ring(9)
    ring.check_gamma(1.52)  # valid before the change
    membership = churn_membership("leave:3@4", ring, 10)
    with pytest.raises(ValueError, match=r"^after the membership change at step 4: gamma=1.52 is "):
        check_every_epoch("exact:gamma=1.52", membership)
    check_every_epoch("exact", membership)  # the topology's own gamma: each graph's, never refused


class Inner:
    """What `MemberAlgorithm` reads of an algorithm instance."""

    def __init__(self, total, communication, lost=False):
        self.names, self.params = ["w"], [torch.zeros(2)]
        self.time_total, self.time_communication, self.lost = total, communication, lost
        self.loaded = None

    def step(self):
        if self.lost:
            raise PeerLostError("peer 3 was lost")

    def state_dict(self):
        return {"x": 1}

    def load_state_dict(self, state):
        self.loaded = state


def test_the_member_algorithm_adds_up_every_instances_timers_and_counts_interrupted_steps():
    algorithm = MemberAlgorithm("exact", Inner(2.0, 0.5))
    algorithm.replace(Inner(1.0, 0.25, lost=True), epoch=1)
    assert (algorithm.time_total, algorithm.time_communication) == (3.0, 0.75)
    assert algorithm.time_compute == 2.25
    algorithm.step()  # a lost peer interrupted this step's gossip: dropped, counted
    assert algorithm.interrupted_steps == 1
    assert algorithm.lost is True  # anything else is the current instance's


def test_an_algorithm_state_of_another_membership_epoch_is_refused():
    algorithm = MemberAlgorithm("exact", Inner(0.0, 0.0), epoch=2)
    state = algorithm.state_dict()
    assert state == {"membership_epoch": 2, "inner": {"x": 1}}
    with pytest.raises(ValueError, match="for membership epoch 2, but this peer is in epoch 3"):
        MemberAlgorithm("exact", Inner(0.0, 0.0), epoch=3).load_state_dict(state)
    algorithm.load_state_dict(state)
    assert algorithm.inner.loaded == {"x": 1}
