"""Gossip on topologies that change every step (schedules) and push-sum on directed graphs."""

from __future__ import annotations

import pytest
import torch

import topologies
from conftest import run_scenario_mpi
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.algorithms.lowrank import ORTHO_EPS, orthonormalize_
from gossip_powersgd.algorithms.powergossip import edge_seed
from gossip_powersgd.comm import LocalCluster
from gossip_powersgd.metrics import mean_active_degree
from gossip_powersgd.training.config import TrainConfig, validate_config

SCHEDULES = ["one_peer_exponential:8", "matchings:8", "edge_sampling:ring:8:0.5",
             "cyclic:ring:8,star:8"]


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
        assert out[i] == pytest.approx((i ** 3 + j ** 3) / 2, abs=1e-12)


# ---- PowerGossip --------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SCHEDULES)
@pytest.mark.parametrize("batched", [True, False])
def test_powergossip_preserves_the_average_on_every_schedule(spec, batched):
    def peer(comm):
        xs = start(comm.rank)
        algorithm = make_algorithm(f"powergossip:rank=2,iters=2,batched={batched},"
                                   "min_compression_rate=0", xs, comm)
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


def rounding_bound(factor, mi, mj) -> float:
    """How far two correct float64 implementations of one PowerGossip half-step on edge (i, j) may
    land apart, to first order: the models may differ by up to this after the update.

    The factor F about to be orthonormalised was computed as a difference of products,
    F = (M_j - M_i) X with X the previous orthonormal factor, and another implementation (batched
    bmm, another BLAS kernel, AVX-512 vs AVX2) sums those products in another order. Each entry
    then differs by up to a = c·u·(|M_i| + |M_j|) (u = 2^-53, c = the dot products' length, the
    standard forward-error bound of a dot product; |X| <= 1). Gram-Schmidt then moves the k-th
    normalised direction by up to m_k = (a + |v_k| · sum_{j<k} m_j) / |v_k⊥|: the vector's own
    perturbation a, plus what the earlier directions' moves do to its projection, divided by
    |v_k⊥| = |R_kk|, what is left of the k-th vector after removing the previous ones (the code
    divides by norm + ORTHO_EPS, so never by less than ORTHO_EPS). The update P·Pᵀ·D (or D·Q·Qᵀ)
    moves by up to 2 · sum_k m_k · |D|, D = M_j - M_i. When D is nearly rank-1, the second vector of
    a rank-2 factor is almost parallel to the first, |R_11| is tiny and the normalised second
    direction is barely determined by the data: that is the conditioning, not a bug of either side.
    The bound adds up over half-steps: gossip with a doubly stochastic W and gamma = 1 does not
    amplify model differences, and the warm-started factors carry earlier errors forward only at
    second order.
    """
    unit = torch.finfo(torch.float64).eps / 2
    length = max(factor.shape[-1], *mi.shape)
    absolute = length * unit * (torch.linalg.matrix_norm(mi) + torch.linalg.matrix_norm(mj)).item()
    r = torch.linalg.qr(factor[0].T, mode="r")[1]
    left = r.diagonal().abs().clamp(min=ORTHO_EPS).tolist()
    lengths = torch.linalg.vector_norm(factor[0], dim=-1).tolist()
    moved = []  # how far each normalised direction may move
    for k in range(len(left)):
        moved.append((absolute + lengths[k] * sum(moved)) / left[k])
    return 2.0 * sum(moved) * torch.linalg.matrix_norm(mj - mi).item()


def reference_powergossip(schedule, steps: int, rank: int, iters: int, seed: int = 0):
    """PowerGossip written edge by edge: one (P, Q, half-step counter) per union edge, the active
    edges of step t only, one matrix (6 x 5) and one vector gossiped exactly.

    Returns (models, edges); edges[(i, j)]["bound"] adds up, over that edge's half-steps, how far
    another correct float64 implementation may land from these models (``rounding_bound``)."""
    n = schedule.size
    models = [start(i, ((6, 5), (4,))) for i in range(n)]
    edges = {}
    for i in range(n):
        for j in schedule.union.neighbors(i):
            if i < j:
                g = torch.Generator().manual_seed(edge_seed(seed, i, j))
                q = torch.randn((1, rank, 5), generator=g, dtype=torch.float64)
                edges[(i, j)] = {"Q": q, "P": torch.zeros(1, rank, 6, dtype=torch.float64), "count": 0,
                                 "bound": 0.0}
    for t in range(steps):
        graph = schedule.at(t)
        active = [(i, j) for (i, j) in edges if j in graph.neighbors(i)]
        for iteration in range(iters):
            updates = [torch.zeros(6, 5, dtype=torch.float64) for _ in range(n)]
            for (i, j) in active:
                e = edges[(i, j)]
                e["count"] += 1
                mi, mj = models[i][0].unsqueeze(0), models[j][0].unsqueeze(0)
                if e["count"] % 2 == 1:
                    e["bound"] += rounding_bound(e["Q"], mi[0], mj[0])
                    orthonormalize_(e["Q"])
                    e["P"] = torch.bmm(e["Q"], mj.transpose(1, 2)) - torch.bmm(e["Q"], mi.transpose(1, 2))
                else:
                    e["bound"] += rounding_bound(e["P"], mi[0], mj[0])
                    orthonormalize_(e["P"])
                    e["Q"] = torch.bmm(e["P"], mj) - torch.bmm(e["P"], mi)
                u = graph.weight(i, j) * (e["P"][0].T @ e["Q"][0])
                updates[i] += u
                updates[j] -= u
            vectors = [m[1].clone() for m in models]
            for i in range(n):
                models[i][0] += updates[i]
                if iteration == 0:
                    for j in graph.neighbors(i):
                        models[i][1] += graph.weight(i, j) * (vectors[j] - vectors[i])
    return models, edges


@pytest.mark.parametrize("spec", ["one_peer_exponential:8", "edge_sampling:ring:8:0.5"])
@pytest.mark.parametrize("batched", [True, False])
def test_powergossip_on_a_schedule_equals_the_per_edge_reference(spec, batched):
    schedule = topologies.parse(spec)

    def peer(comm):
        xs = start(comm.rank, ((6, 5), (4,)))
        algorithm = make_algorithm(f"powergossip:rank=2,iters=3,batched={batched},"
                                   "min_compression_rate=0", xs, comm)
        for _ in range(7):
            algorithm.step()
        return xs

    out = LocalCluster(schedule).run(peer)
    expected, edges = reference_powergossip(schedule, 7, rank=2, iters=3)
    # The two computations agree to float64 rounding as amplified by the conditioning of the
    # Gram-Schmidt steps (rounding_bound), not to a fixed 1e-10: on edge_sampling:ring:8:0.5 one
    # edge's difference becomes nearly rank-1, |R_11| of its rank-2 factor drops to ~3e-6 of the
    # first vector's norm, and 6 digits go (4.5e-9 with AVX-512 kernels, 7.9e-9 with
    # ATEN_CPU_CAPABILITY=default, against a worst-case bound of 5.8e-7), while
    # one_peer_exponential:8 stays well conditioned (~3e-15 against 6e-12). A wrong edge, counter
    # or weight is far outside either: scaling every update by 1 + 1e-6 moves the models by 2e-6
    # and 0.19.
    tolerance = sum(e["bound"] for e in edges.values())
    worst = max((a - b).abs().max().item() for got, want in zip(out, expected)
                for a, b in zip(got, want))
    assert worst <= tolerance, f"largest difference {worst:.3g}, rounding bound {tolerance:.3g}"


def test_an_idle_edge_resumes_from_its_last_factor():
    # one_peer_exponential:4: peer 0 talks to 1 at even steps and to 2 at odd ones
    def peer(comm):
        xs = start(comm.rank)
        algorithm = make_algorithm("powergossip:rank=1,min_compression_rate=0", xs, comm)
        seen = []
        for _ in range(3):
            algorithm.step()
            state = algorithm.state_dict()
            seen.append(({k: v.clone() for k, v in state.items() if k.startswith("factor.")},
                         {k: v for k, v in state.items() if k.startswith("edge_half_steps.")}))
        return seen

    seen = LocalCluster("one_peer_exponential:4").run(peer)[0]
    (f0, c0), (f1, c1), (f2, c2) = seen
    edge1 = [k for k in f0 if k.startswith("factor.1.")]
    assert edge1 and all(torch.equal(f0[k], f1[k]) for k in edge1)  # idle at step 1: untouched
    assert not all(torch.equal(f1[k], f2[k]) for k in edge1)  # back at step 2: it moved on
    assert (c0["edge_half_steps.1"], c1["edge_half_steps.1"], c2["edge_half_steps.1"]) == (1, 1, 2)
    assert (c0["edge_half_steps.2"], c1["edge_half_steps.2"], c2["edge_half_steps.2"]) == (0, 1, 1)
    # the resumed edge takes the left half-step (P from the last right one), as the reference does
    models, edges = reference_powergossip(topologies.parse("one_peer_exponential:4"), 3, 1, 1)
    assert edges[(0, 1)]["count"] == 2


# ---- compressed gossip ----------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["choco:compressor=topk:0.5,gamma=0.5",
                                       "deepsqueeze:compressor=sign,gamma=0.1"])
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

@pytest.mark.parametrize("spec,schedule", [
    ("powergossip:rank=1,iters=1", "matchings:8"),
    ("choco:compressor=randomk:0.5,gamma=0.4", "edge_sampling:ring:8:0.5"),
    ("pushsum", "directed_exponential:8"),
])
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


def test_mean_active_degree_counts_each_steps_graph():
    assert mean_active_degree(topologies.parse("one_peer_exponential:16"), 10) == 1.0
    assert mean_active_degree(topologies.parse("ring:8"), 10) == 2.0
    assert mean_active_degree(topologies.parse("directed_exponential:8"), 5) == 1.0
    cyclic = topologies.parse("cyclic:ring:8,star:8")
    assert mean_active_degree(cyclic, 3) == pytest.approx((2 + 14 / 8 + 2) / 3)


def mpi_scenario(comm):
    """PowerGossip, Choco and push-sum (or exact) on the communicator's schedule."""
    out = {}
    specs = (["pushsum"] if comm.is_directed else
             ["powergossip:rank=2,iters=2,min_compression_rate=0",
              "choco:compressor=randomk:0.5,gamma=0.4"])
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
    mpi = run_scenario_mpi(4, "test_dynamic:mpi_scenario", spec, tmp_path, timeout=180)
    local = LocalCluster(topologies.parse(spec)).run(mpi_scenario)
    for a, b in zip(mpi, local):
        assert a.keys() == b.keys()
        for key in a:
            if key in ("bytes", "rounds"):
                assert a[key] == b[key]
            else:
                assert all(torch.equal(u, v) for u, v in zip(a[key], b[key]))


# ---- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["exact", "powergossip:rank=1", "choco:compressor=sign,gamma=0.1",
                                  "deepsqueeze:compressor=sign,gamma=0.1"])
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
