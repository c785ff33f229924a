"""algorithms/exact.py: exact gossip's step against its closed form, its consensus step (default,
stable range), its bytes and the topologies it refuses (the invariants every algorithm keeps:
test_contract.py)."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, make_algorithm
from gossip_powersgd.algorithms import ExactGossip
from gossip_powersgd.algorithms.exact import check_gamma_positive, resolve_gamma
from tests.algorithms.test_base_inputs import SCHEDULES, tensors

EPS64 = torch.finfo(torch.float64).eps


def test_one_step_is_the_closed_form_with_the_topologys_weights():
    """x_i + gamma sum_j W[i,j] (x_j - x_i), in float64: a handful of operations on values of
    order 1, so within a few float64 roundings of the reference (16 eps, relative to |x|max)."""
    topology = topologies.parse("star:4")  # irregular: the weights differ per edge
    start = LocalCluster(topology, cooperative=False).run(lambda comm: tensors(comm))

    def peer(comm):
        x = tensors(comm)
        ExactGossip(x, comm, gamma=0.7).step()
        return x

    after = LocalCluster(topology, cooperative=False).run(peer)
    for i in range(4):
        for k in range(2):
            mixed = start[i][k] + 0.7 * sum(
                topology.weight(i, j) * (start[j][k] - start[i][k]) for j in topology.neighbors(i)
            )
            scale = float(torch.stack([s[k].abs().max() for s in start]).max())
            torch.testing.assert_close(after[i][k], mixed, rtol=0, atol=16 * EPS64 * scale)


def test_the_default_step_is_the_topologys_or_one_on_a_schedule():
    def peer(comm):
        return resolve_gamma(None, comm), resolve_gamma("0.5", comm)

    assert LocalCluster(topologies.ring(5), cooperative=False).run(peer)[0] == (
        topologies.ring(5).gamma,
        0.5,
    )
    assert LocalCluster(topologies.parse("matchings:4"), cooperative=False).run(peer)[0] == (
        1.0,
        0.5,
    )


@pytest.mark.parametrize("gamma", [float("inf"), 1e39, "1e39"])
def test_an_infinite_step_or_one_float32_cannot_hold_is_refused_naming_gamma(gamma):
    """Every algorithm with a γ checks it here (PowerGossip, and Choco and DeepSqueeze through
    `require_tuned_gamma`): γ = inf ended in a non-finite loss blamed on the learning rate, 1e39 in
    torch's overflow error from inside the compiled update."""
    with pytest.raises(
        ValueError, match=r"^gamma must be finite and at most 3\.403e\+38 \(float32\)"
    ):
        check_gamma_positive(gamma)
    largest = torch.finfo(torch.float32).max  # the largest γ accepted
    assert check_gamma_positive(largest) == largest


@pytest.mark.parametrize(
    "spec, gamma, message",
    [
        ("ring:3", 0.0, r"^gamma must be > 0, got 0\.0$"),
        (
            "directed_exponential:4",
            None,
            r"^exact gossip needs symmetric edges, but the topology 'directed_exponential:4' is "
            r"directed: use algorithm pushsum on directed graphs, or an undirected topology$",
        ),
    ],
)
def test_a_zero_step_or_a_directed_graph_is_refused_with_the_fix(spec, gamma, message):
    def peer(comm):
        ExactGossip([torch.zeros(3)], comm, gamma=gamma)

    with pytest.raises(ValueError, match=message):
        LocalCluster(topologies.parse(spec), cooperative=False).run(peer)


def test_bytes_per_step_is_the_whole_model_to_each_neighbour_of_that_step():
    """float32, 30 + 4 entries: 136 bytes a neighbour; star:5's centre has 4 neighbours, a leaf 1;
    on matchings:4 every peer has one partner at every step."""

    def peer(comm):
        gossip = ExactGossip([torch.zeros(6, 5), torch.zeros(4)], comm)
        return gossip.bytes_per_step()

    assert (
        LocalCluster(topologies.parse("star:5"), cooperative=False).run(peer) == [544] + [136] * 4
    )
    assert LocalCluster(topologies.parse("matchings:4"), cooperative=False).run(peer) == [136] * 4


@pytest.mark.parametrize(
    "build",
    [
        lambda x, comm: ExactGossip(x, comm, gamma=3.0),
        lambda x, comm: make_algorithm("exact:gamma=3", x, comm),
    ],
)
def test_exact_gossip_refuses_an_unstable_gamma_in_one_line(build):
    def peer(comm):
        build(tensors(comm), comm)

    with pytest.raises(
        ValueError, match=r"^gamma=3 is outside the stable range \(0, 1\.5\) of "
    ) as info:
        LocalCluster(topologies.ring(4)).run(peer)
    assert "\n" not in str(info.value)


def test_exact_gossip_keeps_stable_and_default_gammas():
    def peer(comm):
        return ExactGossip(tensors(comm), comm, gamma=1.4).gamma, ExactGossip(
            tensors(comm), comm
        ).gamma

    explicit, default = LocalCluster(topologies.ring(4)).run(peer)[0]
    assert explicit == 1.4 and default == topologies.ring(4).gamma


@pytest.mark.parametrize("spec", SCHEDULES)
def test_exact_gossip_refuses_an_unstable_gamma_on_a_schedule(spec):
    top = topologies.parse(spec).gamma_stable_max

    def peer(comm, gamma):
        return ExactGossip(tensors(comm), comm, gamma=gamma).gamma

    with pytest.raises(
        ValueError,
        match=rf"^gamma=5 is outside the stable range \(0, {top:.4g}\) "
        rf"of {spec} \(",
    ) as info:
        LocalCluster(topologies.parse(spec)).run(peer, 5.0)
    assert "\n" not in str(info.value)
    assert LocalCluster(topologies.parse(spec)).run(peer, 0.99 * top) == [0.99 * top] * 8
