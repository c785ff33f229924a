"""Gossip on topologies that change every step (schedules) and push-sum on directed graphs."""

from __future__ import annotations

import pytest
import torch

import topologies
from tests.conftest import run_scenario_mpi
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.algorithms.reference import reference_powergossip
from gossip_powersgd.comm import LocalCluster
from gossip_powersgd.training.config import TrainConfig, validate_config

SCHEDULES = [
    "one_peer_exponential:8",
    "matchings:8",
    "edge_sampling:ring:8:0.5",
    "cyclic:ring:8,star:8",
]


def start(rank: int, shapes=((6, 5), (4,), (6, 5))):
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes]


# ---- closed forms -------------------------------------------------------------------------------


def test_one_peer_exponential_averages_exactly_in_log2_n_steps():
    def peer(comm):
        x = torch.tensor([float(comm.rank) ** 2, 3.0 - comm.rank], dtype=torch.float64)
        algorithm = make_algorithm("exact", [x], comm)
        for _ in range(4):
            algorithm.step()
        return x, comm.stats.rounds

    out = LocalCluster("one_peer_exponential:16").run(peer)
    mean = torch.tensor([sum(i * i for i in range(16)) / 16, 3.0 - 7.5], dtype=torch.float64)
    for x, rounds in out:
        assert torch.allclose(x, mean, rtol=0, atol=1e-12)
        assert rounds == 4


def test_a_matching_step_averages_each_pair():
    schedule = topologies.parse("matchings:8:3")
    graph = schedule.at(0)

    def peer(comm):
        x = torch.tensor([float(comm.rank) ** 3], dtype=torch.float64)
        make_algorithm("exact", [x], comm).step()
        return x.item()

    out = LocalCluster(schedule).run(peer)
    for i in range(8):
        (j,) = graph.neighbors(i) or (i,)
        assert out[i] == pytest.approx((i**3 + j**3) / 2, abs=1e-12)


# ---- PowerGossip --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SCHEDULES)
@pytest.mark.parametrize("batched", [True, False])
def test_powergossip_preserves_the_average_on_every_schedule(spec, batched):
    def peer(comm):
        xs = start(comm.rank)
        algorithm = make_algorithm(
            f"powergossip:rank=2,iters=2,batched={batched},min_compression_rate=0", xs, comm
        )
        sent = 0
        for _ in range(12):
            sent += algorithm.bytes_per_step()
            algorithm.step()
        assert comm.stats.bytes_sent == sent  # the formula is what travels, step by step
        return xs

    out = LocalCluster(spec).run(peer)
    for k in range(3):
        before = sum(start(r)[k] for r in range(8)) / 8
        after = sum(o[k] for o in out) / 8
        assert (before - after).abs().max().item() <= 1e-12


def test_an_idle_edge_resumes_from_its_last_factor():
    # one_peer_exponential:4: peer 0 talks to 1 at even steps and to 2 at odd ones
    def peer(comm):
        xs = start(comm.rank)
        algorithm = make_algorithm("powergossip:rank=1,min_compression_rate=0", xs, comm)
        seen = []
        for _ in range(3):
            algorithm.step()
            state = algorithm.state_dict()
            seen.append(
                (
                    {k: v.clone() for k, v in state.items() if k.startswith("factor.")},
                    {k: v for k, v in state.items() if k.startswith("edge_half_steps.")},
                )
            )
        return seen

    seen = LocalCluster("one_peer_exponential:4").run(peer)[0]
    (f0, c0), (f1, c1), (f2, c2) = seen
    edge1 = [k for k in f0 if k.startswith("factor.1.")]
    assert edge1 and all(torch.equal(f0[k], f1[k]) for k in edge1)  # idle at step 1: untouched
    assert not all(torch.equal(f1[k], f2[k]) for k in edge1)  # back at step 2: it moved on
    assert (c0["edge_half_steps.1"], c1["edge_half_steps.1"], c2["edge_half_steps.1"]) == (1, 1, 2)
    assert (c0["edge_half_steps.2"], c1["edge_half_steps.2"], c2["edge_half_steps.2"]) == (0, 1, 1)
    # the resumed edge takes the left half-step (P from the last right one), as the reference does
    models = [start(i) for i in range(4)]
    edges = reference_powergossip(
        models, topologies.parse("one_peer_exponential:4"), 3, min_compression_rate=0
    )
    assert edges[(0, 1)].half_steps == 2


# ---- compressed gossip ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm", ["choco:compressor=topk:0.5,gamma=0.5", "deepsqueeze:compressor=sign,gamma=0.1"]
)
@pytest.mark.parametrize("spec", ["one_peer_exponential:8", "edge_sampling:ring:8:0.5"])
def test_compressed_gossip_preserves_the_average_on_schedules(algorithm, spec):
    def peer(comm):
        xs = start(comm.rank)
        a = make_algorithm(algorithm, xs, comm)
        for _ in range(30):
            a.step()
        return xs

    out = LocalCluster(spec).run(peer)
    for k in range(3):
        before = sum(start(r)[k] for r in range(8)) / 8
        after = sum(o[k] for o in out) / 8
        assert (before - after).abs().max().item() <= 1e-12


def test_choco_with_identity_is_exact_gossip_on_a_schedule():
    def peer(comm, spec):
        xs = start(comm.rank)
        a = make_algorithm(spec, xs, comm)
        for _ in range(5):
            a.step()
        return xs

    schedule = topologies.parse("edge_sampling:ring:8:0.5")
    choco = LocalCluster(schedule).run(peer, "choco:compressor=identity,gamma=0.7")
    exact = LocalCluster(schedule).run(peer, "exact:gamma=0.7")
    for a, b in zip(choco, exact):
        assert all(torch.allclose(u, v, rtol=0, atol=1e-12) for u, v in zip(a, b))


# ---- push-sum -------------------------------------------------------------------------------------


def test_pushsum_de_biased_estimates_converge_on_a_non_doubly_stochastic_graph(tmp_path):
    path = tmp_path / "graph.txt"
    path.write_text("0 1\n1 2\n2 0\n0 3\n3 4\n4 0\n1 4\n")
    graph = topologies.from_directed_edge_list(path)
    assert not torch.allclose(torch.tensor(graph.P.sum(axis=1)), torch.ones(5, dtype=torch.float64))

    def peer(comm):
        x = torch.tensor([float(comm.rank) ** 2, 1.0 + comm.rank], dtype=torch.float64)
        algorithm = make_algorithm("pushsum", [x], comm)
        errors = []
        for _ in range(150):
            algorithm.step()
            errors.append((x - torch.tensor([6.0, 3.0], dtype=torch.float64)).abs().max().item())
        return errors, algorithm.weight

    out = LocalCluster(graph).run(peer)
    assert all(errors[-1] < 1e-10 for errors, _ in out)
    assert any(abs(weight - 1.0) > 0.1 for _, weight in out)  # x alone would be biased
    assert sum(weight for _, weight in out) == pytest.approx(5.0, abs=1e-12)


def test_pushsum_on_the_directed_exponential_schedule_averages_in_log2_n_steps():
    def peer(comm):
        x = torch.tensor([float(comm.rank) ** 2], dtype=torch.float64)
        algorithm = make_algorithm("pushsum", [x], comm)
        for _ in range(3):
            assert algorithm.bytes_per_step() == 2 * 8  # one out-neighbour: x and w
            algorithm.step()
        return x.item(), comm.stats.messages_sent

    for value, messages in LocalCluster("directed_exponential:8").run(peer):
        assert value == pytest.approx(sum(i * i for i in range(8)) / 8, abs=1e-12)
        assert messages == 3


# ---- resume, bytes, MPI ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,schedule",
    [
        ("powergossip:rank=1,iters=1", "matchings:8"),
        ("choco:compressor=randomk:0.5,gamma=0.4", "edge_sampling:ring:8:0.5"),
        ("pushsum", "directed_exponential:8"),
    ],
)
def test_resume_equals_uninterrupted(spec, schedule):
    def peer(comm):
        xs = start(comm.rank)
        a = make_algorithm(spec, xs, comm)
        for _ in range(6):
            a.step()
        straight = [x.clone() for x in xs]
        xs = start(comm.rank)
        a = make_algorithm(spec, xs, comm)
        for _ in range(3):
            a.step()
        state, saved = a.state_dict(), [x.clone() for x in xs]
        xs = saved
        b = make_algorithm(spec, xs, comm)
        b.load_state_dict(state)
        for _ in range(3):
            b.step()
        return straight, xs

    for straight, resumed in LocalCluster(schedule).run(peer):
        assert all(torch.equal(u, v) for u, v in zip(straight, resumed))


def mpi_scenario(comm):
    """PowerGossip, Choco and push-sum (or exact) on the communicator's schedule."""
    out = {}
    specs = (
        ["pushsum"]
        if comm.is_directed
        else [
            "powergossip:rank=2,iters=2,min_compression_rate=0",
            "choco:compressor=randomk:0.5,gamma=0.4",
        ]
    )
    for spec in specs:
        xs = start(comm.rank)
        a = make_algorithm(spec, xs, comm)
        for _ in range(5):
            a.step()
        out[spec] = xs
    out["bytes"] = comm.stats.bytes_sent
    out["rounds"] = comm.stats.rounds
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("spec", ["one_peer_exponential:4", "directed_exponential:4"])
def test_mpi_equals_local_on_a_schedule(tmp_path, spec):
    mpi = run_scenario_mpi(
        4, "tests.algorithms.test_pushsum:mpi_scenario", spec, tmp_path, timeout=180
    )
    local = LocalCluster(topologies.parse(spec)).run(mpi_scenario)
    for a, b in zip(mpi, local):
        assert a.keys() == b.keys()
        for key in a:
            if key in ("bytes", "rounds"):
                assert a[key] == b[key]
            else:
                assert all(torch.equal(u, v) for u, v in zip(a[key], b[key]))


# ---- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "exact",
        "powergossip:rank=1",
        "choco:compressor=sign,gamma=0.1",
        "deepsqueeze:compressor=sign,gamma=0.1",
    ],
)
def test_symmetric_algorithms_refuse_a_directed_graph_naming_pushsum(spec):
    def peer(comm):
        make_algorithm(spec, [torch.zeros(3, 2)], comm)

    with pytest.raises(ValueError, match="pushsum") as info:
        LocalCluster("directed_exponential:4").run(peer)
    assert "\n" not in str(info.value)
    config = TrainConfig(topology="directed_exponential:8", algorithm=spec)
    with pytest.raises(ValueError, match="bad value for 'algorithm'.*pushsum") as info:
        validate_config(config, deep=False)
    assert "\n" not in str(info.value)


def test_pushsum_refuses_an_undirected_w_with_eigenvalue_minus_one(tmp_path):
    """Weights 1/2 around a ring of 4 and nothing kept (W[i,i] = 0): W swaps the two halves of the
    bipartite ring, and push-sum, which mixes with W itself (no gamma), oscillated for ever; exact
    gossip's gamma (2/3 here) damps it."""
    edges = tmp_path / "bipartite.txt"
    edges.write_text("0 1 0.5\n1 2 0.5\n2 3 0.5\n3 0 0.5\n")
    config = TrainConfig(topology=f"file:{edges}", algorithm="pushsum")
    with pytest.raises(ValueError, match="bad value for 'algorithm'.*eigenvalue -1") as info:
        validate_config(config, deep=False)
    assert "\n" not in str(info.value)

    def peer(comm, spec):
        x = [torch.tensor([float(comm.rank)], dtype=torch.float64)]
        algorithm = make_algorithm(spec, x, comm)
        for _ in range(60):
            algorithm.step()
        return x[0].item()

    topology = topologies.parse(f"file:{edges}")
    with pytest.raises(ValueError, match="use algorithm exact"):
        LocalCluster(topology).run(peer, "pushsum")
    # exact gossip reaches the mean 1.5: contraction 1/3 per step, 60 steps
    assert all(abs(v - 1.5) < 1e-12 for v in LocalCluster(topology).run(peer, "exact"))
    validate_config(TrainConfig(topology="ring:4", algorithm="pushsum"), deep=False)


def test_bad_schedules_and_step_keys_give_one_line_errors():
    for topology in ["one_peer_exponential:6", "matchings:1", "cyclic:ring:8,ring:4"]:
        with pytest.raises(ValueError, match="bad value for 'topology'") as info:
            validate_config(TrainConfig(topology=topology, algorithm="exact"), deep=False)
        assert "\n" not in str(info.value)

    def peer(comm):
        x = torch.zeros(2)
        buffers = {j: torch.zeros(2) for j in comm.neighbors}  # the union's, not step 0's
        comm.exchange({j: x for j in buffers}, buffers, step=0)

    with pytest.raises(ValueError, match=r"buffer per neighbour \[\d\], got send \[\d, \d\]"):
        LocalCluster("one_peer_exponential:4", timeout=5).run(peer)
    validate_config(TrainConfig(topology="directed_exponential:8", algorithm="pushsum"), deep=False)
