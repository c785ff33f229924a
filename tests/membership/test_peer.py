"""Peers leave and join a gossip run: the survivors' average is preserved exactly from the step
after a change on, the change itself moves it by the closed form, per-edge state is carried or
started fresh at both ends alike, and a joiner gets its state by live transfer."""

from __future__ import annotations

import math

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, make_algorithm
from gossip_powersgd.comm.membership import MemberCommunicator
from gossip_powersgd.membership.churn import churn_membership
from gossip_powersgd.membership.peer import ParamsState, PeerMembership
from membership_fixtures import CHURN, SHAPES, STEPS, peer_tensors

CHANGES = (4, 7, 12, 16)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def magnitude(algorithm, params) -> float:
    """The largest value any state the step adds from holds: the model, and Choco's public
    copies or DeepSqueeze's x + error (what its compressed messages are made of)."""
    inner = algorithm.inner
    values = [flat(params).abs().max()]
    for name in ("x_hat_out", "x_hat_in"):
        for v in getattr(inner, name, {}).values():
            values.append((v[0] if isinstance(v, tuple) else v).abs().max())
    if hasattr(inner, "error"):
        values.append((flat(params) + inner.error.to(torch.float64)).abs().max())
    return float(max(values))


def gossip_run(comm, spec, topology, churn, dtype, join="average"):
    """Gossip only (no training): per step, the model before and after the membership change of
    that step (None when absent) and after the step's gossip; each change's shift."""
    params = peer_tensors(comm, dtype)
    member = MemberCommunicator(comm)
    peer = PeerMembership(member, churn_membership(churn, topology, STEPS), join=join)
    algorithm = peer.bind(spec, make_algorithm(spec, params, member))
    state = ParamsState(params)
    trace, shifts, largest = [], {}, 0.0
    for t in range(STEPS):
        before = flat(params) if peer.live else None
        change = peer.advance(t, state)
        if change is not None and change.shift is not None:
            shifts[t] = change.shift
        if not peer.live:
            trace.append((before, None, None))
            continue
        middle = flat(params)
        algorithm.step()
        largest = max(largest, magnitude(algorithm, params))
        trace.append((before, middle, flat(params)))
    return trace, shifts, largest, member.stats.as_dict()


def live_mean(results, t, slot):
    rows = [r[0][t][slot] for r in results if r[0][t][slot] is not None]
    # fsum: the correctly rounded sum of each coordinate, so the reference adds no error of its own
    stacked = torch.stack(rows)
    return torch.tensor([math.fsum(col) for col in stacked.T.tolist()]) / len(rows)


ALGORITHMS = [
    ("exact", 1, 1),
    ("powergossip:rank=1", 1, 1),
    ("powergossip:rank=4", 4, 1),
    ("powergossip:rank=4,iters=2", 4, 2),
    ("powergossip:rank=1,iters=2", 1, 2),
    ("choco:compressor=sign,gamma=0.2", 1, 1),
    ("choco:compressor=topk:0.2,gamma=0.3", 1, 1),
    ("deepsqueeze:compressor=sign,gamma=0.1", 1, 1),
    ("pushsum", 1, 1),
]


def graph_limits(topology):
    """The largest degree and off-diagonal weight of every graph the run gossips on."""
    membership = churn_membership(CHURN, topology, STEPS)
    graphs = [membership.graph(e) for e in membership.epochs]
    steps = [g.at(t) for g in graphs for t in range(g.period or STEPS)]
    degree = max(max(s.degrees) for s in steps)
    weight = max(
        float((s.W - torch.diag(torch.diag(torch.tensor(s.W))).numpy()).max()) for s in steps
    )
    return degree, weight


def drift_bound(results, topology, dtype, rank, iters) -> float:
    """What float rounding can move the live average by over the run, per coordinate.

    Each step, each live peer adds to each coordinate at most N = iters (deg r + 2) terms (deg
    neighbours, r factor vectors for PowerGossip, 1 otherwise, the exact part, its own previous
    value); each term is gamma W[i, j] times a difference of two states, projected by
    PowerGossip onto an orthonormal basis, so at most T = gamma W_max sqrt(12) 2 M, M the
    largest state value of the run (measured), gamma <= 1.5 here, sqrt(12) the longest row or
    column a projection sums. Adding N terms to x errs by at most N u (|x| + N T) (Higham's
    gamma_N), and computing a term by at most 2 u T (one product, one difference; the two ends'
    terms of exact gossip and PowerGossip are exact negatives, the others' need not be). Summed
    over the live peers and the steps, divided by the live count: the average's bound."""
    u = torch.finfo(dtype).eps / 2
    degree, weight = graph_limits(topology)
    n_terms = iters * (degree * rank + 2)
    largest = max(r[2] for r in results)
    term = 1.5 * weight * math.sqrt(12) * 2 * largest
    per_step = n_terms * u * (largest + n_terms * term) + n_terms * 2 * u * term
    return STEPS * per_step


def largest_move(results, start, end) -> float:
    """How far some live model moved during an epoch (what a broken invariant is made of)."""
    return max(
        float((r[0][end - 1][2] - r[0][start][1]).abs().max())
        for r in results
        if r[0][start][1] is not None and r[0][end - 1][2] is not None
    )


@pytest.mark.parametrize("spec, rank, iters", ALGORITHMS)
@pytest.mark.parametrize("topology_spec", ["ring:8", "torus:2x4", "matchings:8"])
def test_survivors_average_is_preserved_from_the_step_after_a_change(
    spec, rank, iters, topology_spec
):
    topology = topologies.parse(topology_spec)
    results = LocalCluster(topology).run(gossip_run, spec, topology, CHURN, torch.float64)
    bound = drift_bound(results, topology, torch.float64, rank, iters)
    moved = 0.0
    for start, end in zip((0,) + CHANGES, CHANGES + (STEPS,)):
        reference = live_mean(results, start, 1)  # just after the change of `start`
        for t in range(start, end):
            drift = float((live_mean(results, t, 2) - reference).abs().max())
            assert drift <= bound, (spec, t, drift, bound)
        moved = max(moved, largest_move(results, start, end))
    # the models did move (the test is not vacuous), by far more than the bound
    assert moved > 1e6 * bound


@pytest.mark.parametrize("spec, rank, iters", ALGORITHMS[:2] + ALGORITHMS[3:4] + ALGORITHMS[5:6])
def test_survivors_average_is_preserved_in_float32(spec, rank, iters):
    topology = topologies.ring(8)
    results = LocalCluster(topology).run(gossip_run, spec, topology, CHURN, torch.float32)
    bound = drift_bound(results, topology, torch.float32, rank, iters)
    for start, end in zip((0,) + CHANGES, CHANGES + (STEPS,)):
        reference = live_mean(results, start, 1)
        for t in range(start, end):
            assert float((live_mean(results, t, 2) - reference).abs().max()) <= bound
    assert largest_move(results, 0, CHANGES[0]) > 10 * bound


@pytest.mark.parametrize("join", ["average", "copy"])
def test_the_change_moves_the_average_by_its_closed_form(join):
    """Leaving peers take their share: the survivors' average is (sum - sum of the leavers) /
    (n - leavers); a joiner adds its transferred model (its surviving neighbours' mean, or the
    lowest one's copy). The measured shift is the norm of the difference, on every peer."""
    topology = topologies.ring(8)
    results = LocalCluster(topology).run(
        gossip_run, "powergossip:rank=1", topology, CHURN, torch.float64, join
    )
    for t in CHANGES:
        before = [(k, r[0][t][0]) for k, r in enumerate(results) if r[0][t][0] is not None]
        after = [(k, r[0][t][1]) for k, r in enumerate(results) if r[0][t][1] is not None]
        old_mean = torch.stack([x for _, x in before]).mean(0)
        survivors = {k: x for k, x in before if k in dict(after)}
        for k, x in after:
            if k in survivors:
                assert torch.equal(x, survivors[k])  # a survivor's model is untouched
                continue
            # the joiner: its surviving neighbours in the ring of the live peers
            live = sorted(dict(after))
            position = live.index(k)
            around = [live[(position - 1) % len(live)], live[(position + 1) % len(live)]]
            around = sorted(j for j in around if j in survivors)
            senders = around[:1] if join == "copy" else around
            expected = torch.stack([survivors[j] for j in senders]).sum(0) / len(senders)
            assert torch.allclose(x, expected, rtol=0, atol=1e-15)
        new_mean = torch.stack([x for _, x in after]).mean(0)
        closed = (sum(survivors.values()) + sum(x for k, x in after if k not in survivors)) / len(
            after
        )
        assert torch.allclose(new_mean, closed, rtol=0, atol=1e-14)
        shift = float((new_mean - old_mean).norm())
        measured = {r[1][t] for r in results if t in r[1]}
        assert len(measured) == 1  # the same value on every peer that took part
        assert measured.pop() == pytest.approx(shift, rel=1e-12)
    left = [(k, r[0][4][0]) for k, r in enumerate(results)]
    # leave of peer 3 at step 4: (8 mean - x_3) / 7, the share that left with it
    everyone = torch.stack([x for _, x in left]).mean(0)
    survivors = torch.stack([x for k, x in left if k != 3]).mean(0)
    assert torch.allclose(survivors, (8 * everyone - left[3][1]) / 7, rtol=0, atol=1e-14)


def test_transfer_bytes_are_counted_apart_from_training_traffic():
    topology = topologies.ring(8)
    results = LocalCluster(topology).run(
        gossip_run, "exact", topology, "leave:3@4,join:3@12", torch.float64, "average"
    )
    payload = sum(math.prod(s) for s in SHAPES) * 8 + 8  # the model, and the step counter
    for k, r in enumerate(results):
        stats = r[3]
        if k in (2, 4):  # peer 3's neighbours hand it the state: header (16 B) and body
            assert stats["transfer_messages_sent"] == 2
            assert payload < stats["transfer_bytes_sent"] < payload + 400  # + the JSON layout
        else:
            assert stats["transfer_bytes_sent"] == stats["transfer_messages_sent"] == 0
    # training traffic: exact gossip's whole model per neighbour per step while a member
    model = sum(math.prod(s) for s in SHAPES) * 8
    steps = {k: sum(1 for x in r[0] if x[2] is not None) for k, r in enumerate(results)}
    assert results[0][3]["bytes_sent"] == 2 * model * steps[0]
    assert steps[3] == STEPS - 8


def test_member_communicator_runs_collectives_over_the_live_peers_only():
    """Peers 0, 2, 3 of 4 (peer 1 away and silent): the all-reduce is the ring over the three,
    the same bits as a 3-peer run of the values; the all-gather and the agreement check name
    peer ids; the run's transport stays a Comm."""
    from gossip_powersgd.comm.base import AgreementError, Comm

    topology = topologies.ring(4)
    repaired = topologies.repair(topology, [0, 2, 3])

    def peer(comm):
        member = MemberCommunicator(comm)
        assert isinstance(member, Comm)
        if comm.rank == 1:
            return None  # away: never called
        member.set_epoch(repaired, [0, 2, 3])
        value = torch.arange(5, dtype=torch.float64) * (comm.rank + 1) + 0.1
        summed = member.allreduce_(value.clone(), op="sum")
        mean = member.allreduce_(value.clone(), op="mean")
        gathered = member.allgather_bytes(bytes([comm.rank]))
        try:
            member.check_agreement("a value", "x" if comm.rank == 3 else "y")
            agreement = None
        except AgreementError as exc:
            agreement = str(exc)
        return summed, mean, gathered, agreement, member.neighbors

    def three(comm):
        value = torch.arange(5, dtype=torch.float64) * ([0, 2, 3][comm.rank] + 1) + 0.1
        return comm.allreduce_(value.clone(), op="sum"), comm.allreduce_(value.clone())

    results = LocalCluster(topology).run(peer)
    reference = LocalCluster(topologies.ring(3)).run(three)
    for k, r in zip((0, 2, 3), (results[0], results[2], results[3])):
        assert torch.equal(r[0], reference[0][0]) and torch.equal(r[1], reference[0][1])
        assert r[2] == [b"\0", b"\2", b"\3"]
        assert (
            r[3]
            == "a value differs across peers: peers [0, 2] hold variant 1; peers [3] hold variant 2"
        )
    assert results[2][4] == (0, 3)  # ring:4 minus peer 1: peer 2's neighbours are 3 and 0
