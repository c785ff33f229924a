"""PowerGossip: the invariants of the reference page (section 7), each a test."""

import math

import pytest
import torch

import shared_launches
import topologies
from gossip_powersgd import ExactGossip, LocalCluster, PowerGossip, consensus_distance
from gossip_powersgd.algorithms.lowrank import orthonormalize_
from tests.conftest import run_scenario_mpi

# A small model: two same-shape matrices (batched together), a conv weight, a bias, and a matrix too
# small to compress (gossiped exactly).
SHAPES = [(12, 9), (12, 9), (6, 3, 2, 2), (12,), (2, 2)]


def peer_tensors(comm, shapes=SHAPES, dtype=torch.float64, seed=42):
    g = torch.Generator().manual_seed(seed + comm.rank)
    return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]


def total(results, k):
    return torch.stack([r[k] for r in results]).sum(0)


# ---- 1. average preservation ------------------------------------------------------------------------
def average_run(comm, steps, dtype, rank, iters, warm):
    x = peer_tensors(comm, dtype=dtype)
    before = [t.clone() for t in x]
    gossip = PowerGossip(x, comm, rank=rank, num_iterations=iters, warm_start=warm)
    for _ in range(steps):
        gossip.step()
    return before, x


def relative_drift(results):
    worst = 0.0
    for k in range(len(SHAPES)):
        before = torch.stack([r[0][k] for r in results]).double().mean(0)
        after = torch.stack([r[1][k] for r in results]).double().mean(0)
        worst = max(worst, float((after - before).norm() / before.norm()))
    return worst


@pytest.mark.parametrize("spec", ["ring:8", "torus:2x4", "random_regular:8:3"])
@pytest.mark.parametrize("rank, iters, warm", [(1, 1, True), (2, 2, True), (4, 1, False)])
def test_average_is_preserved_in_float64(spec, rank, iters, warm):
    results = LocalCluster(topologies.parse(spec)).run(
        average_run, 100, torch.float64, rank, iters, warm
    )
    assert relative_drift(results) <= 1e-12


@pytest.mark.parametrize("rank, iters, warm", [(1, 1, True), (4, 2, False)])
def test_average_is_preserved_in_float32_over_1000_steps(rank, iters, warm):
    results = LocalCluster(topologies.ring(4)).run(
        average_run, 1000 // iters, torch.float32, rank, iters, warm
    )
    assert relative_drift(results) <= 1e-6


# ---- 2. both ends hold bit-identical factors after every half-step ------------------------------
def factor_history(comm, warm):
    x = peer_tensors(comm)
    gossip = PowerGossip(x, comm, rank=2, warm_start=warm)
    history = []
    for _ in range(6):  # one half-step per step
        gossip.step()
        history.append(
            {j: {k: v.clone() for k, v in gossip.factors(j).items()} for j in comm.neighbors}
        )
    return history


@pytest.mark.parametrize("warm", [True, False])
@pytest.mark.parametrize(
    "spec", ["star:5", "small_world:8:4:0.5"]
)  # irregular: degrees differ per end
def test_both_ends_hold_bit_identical_factors(spec, warm):
    topology = topologies.parse(spec)
    results = LocalCluster(topology).run(factor_history, warm)
    for i, j in topology.edges():
        for step in range(6):
            mine, theirs = results[i][step][j], results[j][step][i]
            assert mine.keys() == theirs.keys()
            assert all(torch.equal(mine[k], theirs[k]) for k in mine), (i, j, step)


# ---- 3. two peers, W = 1/2, gamma = 1: the projected component is removed exactly ----------------
def orthonormal(factor):
    """The first matrix of a (batch, n, r) factor with orthonormalised columns, as the step uses it."""
    return orthonormalize_(factor.transpose(1, 2).clone()).transpose(1, 2)[0]


def two_peer_half_steps(comm):
    x = peer_tensors(comm, shapes=[(7, 5)])
    gossip = PowerGossip(x, comm, rank=2, gamma=1.0)
    other = comm.neighbors[0]
    q0 = orthonormal(gossip.factors(other)["0.Q"])
    states = [x[0].clone()]
    gossip.step()  # right half-step: projects onto span(Q)
    p1 = orthonormal(gossip.factors(other)["0.P"])
    states.append(x[0].clone())
    gossip.step()  # left half-step: projects onto span(P)
    states.append(x[0].clone())
    return states, q0, p1


def test_two_peers_remove_the_projected_difference_exactly():
    topology = topologies.ring(2)
    assert topology.weight(0, 1) == 0.5
    (a, q, p), (b, q_b, p_b) = LocalCluster(topology).run(two_peer_half_steps)
    assert torch.equal(q, q_b) and torch.equal(p, p_b)
    d0, d1, d2 = (b[k] - a[k] for k in range(3))
    assert torch.allclose(d1, d0 - d0 @ q @ q.T, atol=1e-12)  # D (I - Q Q^T)
    # zero up to the epsilon that keeps Gram-Schmidt NaN-free (columns have norm 1 - O(1e-8))
    assert torch.allclose(d1 @ q, torch.zeros_like(d1 @ q), atol=1e-6)
    assert torch.allclose(d2, d1 - p @ p.T @ d1, atol=1e-12)  # (I - P P^T) D
    # the sum is untouched
    assert torch.allclose(a[2] + b[2], a[0] + b[0], atol=1e-12)


# ---- 4. square matrices at full rank equal exact gossip ------------------------------------------
def full_rank_vs_exact(comm, algorithm):
    x = peer_tensors(comm, shapes=[(6, 6), (4, 4), (4, 4), (3,)])
    if algorithm == "power":
        gossip = PowerGossip(x, comm, rank=6, min_compression_rate=0)
    else:
        gossip = ExactGossip(x, comm)
    for _ in range(5):
        gossip.step()
    return x


def test_full_rank_square_matrices_equal_exact_gossip():
    topology = topologies.torus(2, 4)
    power = LocalCluster(topology).run(full_rank_vs_exact, "power")
    exact = LocalCluster(topology).run(full_rank_vs_exact, "exact")
    for p, e in zip(power, exact):
        for a, b in zip(p, e):
            # to the epsilon that Gram-Schmidt adds to column norms
            assert torch.allclose(a, b, rtol=0, atol=1e-7)


# ---- 6. one peer is a no-op (identical models are a fixed point: test_contract.py) ------------------
def test_one_peer_is_a_no_op():
    def peer(comm):
        x = peer_tensors(comm)
        before = [t.clone() for t in x]
        gossip = PowerGossip(x, comm)
        gossip.step()
        return before, x, comm.stats.bytes_sent, gossip.bytes_per_step()

    ((before, after, sent, formula),) = LocalCluster(topologies.ring(1)).run(peer)
    assert all(torch.equal(a, b) for a, b in zip(before, after)) and sent == 0 and formula == 0


@pytest.mark.parametrize("topology", ["torus:3x3", "complete:5"])
def test_identical_random_models_move_no_more_than_the_products_rounding(topology):
    """6 beyond test_contract.py's all-ones models on a ring: identical random float32 models on a
    torus and a complete graph (where the two ends of an edge round X Q in different batched
    products, so the exchanged difference is rounding, not 0) stay finite and move by no more
    than that rounding allows. Bound per matrix X (k columns, rank r, Q orthonormal): the computed
    X Q is within gamma_k |X| |Q| of the exact one elementwise (gamma_k = k u / (1 - k u), u the
    unit roundoff), so the difference of the two ends' products has Frobenius norm at most
    2 gamma_k ||X||_F sqrt(r); projecting cannot enlarge it, and a step applies one such
    correction per neighbour, weighted by at most 1: after s steps the change is at most
    s * degree * 2 gamma_k sqrt(r) ||X||_F. (Measured: about one ulp, 7e-9 on entries of 0.1.)"""
    steps, rank = 10, 2
    graph = topologies.parse(topology)
    degree = max(len(graph.neighbors(i)) for i in range(graph.size))
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(32, 16, generator=g) / 4, torch.randn(24, 64, generator=g) / 8]

    def peer(comm):
        x = [t.clone() for t in base]
        gossip = PowerGossip(x, comm, rank=rank)
        for _ in range(steps):
            gossip.step()
        return x

    u = torch.finfo(torch.float32).eps / 2
    for x in LocalCluster(graph).run(peer):
        for after, before in zip(x, base):
            k = before.shape[1]
            gamma_k = k * u / (1 - k * u)
            bound = steps * degree * 2 * gamma_k * math.sqrt(rank) * before.norm()
            assert torch.isfinite(after).all()
            assert (after - before).norm() <= bound, (topology, (after - before).norm(), bound)


# ---- 5. convergence on the authors' consensus problem ----------------------------------------------
def consensus_run(comm, rank, warm, steps):
    g = torch.Generator().manual_seed(42 + comm.rank)
    x = [torch.randn(100, 100, generator=g)]
    gossip = PowerGossip(x, comm, rank=rank, warm_start=warm)
    errors, bits = [consensus_distance(x, comm)], [0]
    for _ in range(steps):
        gossip.step()
        errors.append(consensus_distance(x, comm))
        bits.append(8 * comm.stats.bytes_sent)
    return errors, bits


def test_consensus_error_decays_log_linearly_and_rank_and_warm_start_help():
    ring = topologies.ring(8)
    steps = 150
    rank1, bits1 = LocalCluster(ring).run(consensus_run, 1, True, steps)[0]
    rank2, _ = LocalCluster(ring).run(consensus_run, 2, True, steps)[0]
    restart, bits_restart = LocalCluster(ring).run(consensus_run, 1, False, steps)[0]
    # log-linear decay: the log error falls at a roughly steady rate over the run
    logs = [math.log(e) for e in rank1]
    slopes = [(logs[k + 50] - logs[k]) / 50 for k in (0, 50, 100)]
    assert all(s < 0 for s in slopes)
    assert max(slopes) / min(slopes) > 0.3, slopes
    assert rank1[-1] < 0.5 * rank1[0]
    # higher rank: lower error per step
    assert all(b < a for a, b in zip(rank1[10:], rank2[10:]))
    # warm start beats random restart at equal bits (same message sizes, so equal steps)
    assert bits1 == bits_restart
    assert rank1[-1] < restart[-1]


# ---- 7. the batched path equals a plain per-neighbour loop, in any neighbour order ---------------
def gossip_with_initial_factors(comm, rank, iters, steps, batched=True):
    x = peer_tensors(comm)
    start = [t.clone() for t in x]
    gossip = PowerGossip(x, comm, rank=rank, num_iterations=iters, batch_neighbors=batched)
    factors = {j: {k: v.clone() for k, v in gossip.factors(j).items()} for j in comm.neighbors}
    for _ in range(steps):
        gossip.step()
    return start, factors, x, comm.stats.bytes_sent


def gram_schmidt(matrix):
    out = matrix.clone()
    for k in range(out.shape[1]):
        for previous in range(k):
            out[:, k] -= out[:, previous] * (out[:, previous] @ out[:, k])
        out[:, k] /= out[:, k].norm() + 1e-8
    return out


def reference_powergossip(topology, start, factors, rank, iters, steps, order_seed):
    """Every peer, edge and tensor one at a time, edges in a shuffled order."""
    n = topology.size
    x = [[t.clone() for t in peer] for peer in start]
    gamma = topology.gamma
    # which tensors are compressed, and where their factors sit: groups by first appearance of shape
    groups, where = {}, {}
    for k, shape in enumerate(SHAPES):
        if len(shape) < 2:
            continue
        rows, cols = shape[0], math.prod(shape[1:])
        r = min(rank, rows, cols)
        if (rows + cols) * r < rows * cols:
            group = groups.setdefault((rows, cols), len(groups))
            where[k] = (group, sum(1 for kk in where if where[kk][0] == group))
    edges = topology.edges()
    generator = torch.Generator().manual_seed(order_seed)
    P = {
        (e, k): factors[e[0]][e[1]][f"{where[k][0]}.P"][where[k][1]].clone()
        for e in edges
        for k in where
    }
    Q = {
        (e, k): factors[e[0]][e[1]][f"{where[k][0]}.Q"][where[k][1]].clone()
        for e in edges
        for k in where
    }
    half = 0
    for _ in range(steps):
        for iteration in range(iters):
            half += 1
            delta = [[torch.zeros_like(t) for t in peer] for peer in x]
            for e_index in torch.randperm(len(edges), generator=generator).tolist():
                i, j = edges[e_index]
                w = topology.weight(i, j)
                for k in range(len(SHAPES)):
                    if k in where:
                        mi, mj = (
                            x[i][k].reshape(SHAPES[k][0], -1),
                            x[j][k].reshape(SHAPES[k][0], -1),
                        )
                        if half % 2 == 1:
                            q = Q[(e, k)] = gram_schmidt(Q[((i, j), k)]) if (e := (i, j)) else None
                            P[(e, k)] = mj @ q - mi @ q
                            update = P[(e, k)] @ q.T
                        else:
                            e = (i, j)
                            p = P[(e, k)] = gram_schmidt(P[(e, k)])
                            Q[(e, k)] = mj.T @ p - mi.T @ p
                            update = p @ Q[(e, k)].T
                        update = update.reshape(SHAPES[k])
                    elif iteration == 0:
                        update = x[j][k] - x[i][k]
                    else:
                        continue
                    delta[i][k] += gamma * w * update
                    delta[j][k] -= gamma * w * update
            for i in range(n):
                for k in range(len(SHAPES)):
                    x[i][k] += delta[i][k]
    return x


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("rank, iters", [(1, 1), (2, 3)])
def test_batched_equals_a_per_neighbour_loop_in_any_order(rank, iters, batched):
    topology = topologies.small_world(8, 4, 0.5)
    results = LocalCluster(topology).run(gossip_with_initial_factors, rank, iters, 4, batched)
    start = [r[0] for r in results]
    factors = [r[1] for r in results]
    for order_seed in (0, 1):
        expected = reference_powergossip(topology, start, factors, rank, iters, 4, order_seed)
        for peer, (_, _, got, _) in enumerate(results):
            for a, b in zip(got, expected[peer]):
                assert torch.allclose(a, b, atol=1e-10), peer


# ---- 8. bytes on the wire equal the formula ----------------------------------------------------------
@pytest.mark.parametrize("rank, iters", [(1, 1), (2, 2), (3, 3)])
def test_wire_bytes_equal_the_formula(rank, iters):
    topology = topologies.torus(2, 4)  # degree 3
    steps = 5

    def peer(comm):
        x = peer_tensors(comm, dtype=torch.float32)
        gossip = PowerGossip(x, comm, rank=rank, num_iterations=iters)
        predicted = 0
        for _ in range(steps):
            predicted += gossip.bytes_per_step()
            gossip.step()
        return comm.stats.bytes_sent, comm.stats.messages_sent, predicted

    # by hand: groups (12x9, batch 2) and (6x12); exact part: the bias (12) and the 2x2 matrix (4)
    def matrix_floats(half):
        r1, r2 = min(rank, 9), min(rank, 6)
        return 2 * (12 if half % 2 else 9) * r1 + (6 if half % 2 else 12) * r2

    floats = sum(matrix_floats(h + 1) for h in range(steps * iters)) + steps * 16
    for sent, messages, predicted in LocalCluster(topology).run(peer):
        assert sent == predicted == 3 * 4 * floats
        assert messages == 3 * steps * iters


# ---- 9. MPI runs equal in-process runs bit for bit --------------------------------------------------
def mpi_scenario(comm, steps="6"):
    x = peer_tensors(comm, dtype=torch.float32)
    gossip = PowerGossip(x, comm, rank=2, num_iterations=2)
    for _ in range(int(steps)):
        gossip.step()
    restart = peer_tensors(comm, dtype=torch.float32, seed=7)
    other = PowerGossip(restart, comm, rank=1, warm_start=False, seed=3)
    for _ in range(int(steps)):
        other.step()
    return {
        "x": x,
        "restart": restart,
        "bytes": comm.stats.bytes_sent,
        "factors": {str(j): gossip.factors(j) for j in comm.neighbors},
    }


@pytest.mark.mpi
@pytest.mark.parametrize("n, spec", [(4, "ring:4"), (8, "torus:2x4")])
def test_mpi_equals_local_bit_for_bit(tmp_path, tmp_path_factory, n, spec):
    if spec == "ring:4":  # launched with the other ring:4 comparisons (shared_launches)
        mpi = [r["power"] for r in shared_launches.ring4("mpi", tmp_path_factory)]
        local = [r["power"] for r in shared_launches.ring4_local()]
    else:
        scenario = "tests.algorithms.test_powergossip:mpi_scenario"
        mpi = run_scenario_mpi(n, scenario, spec, tmp_path, timeout=180)
        local = LocalCluster(topologies.parse(spec)).run(mpi_scenario)
    for a, b in zip(mpi, local):
        assert all(torch.equal(u, v) for u, v in zip(a["x"], b["x"]))
        assert all(torch.equal(u, v) for u, v in zip(a["restart"], b["restart"]))
        assert a["bytes"] == b["bytes"]
        for j in a["factors"]:
            assert all(torch.equal(a["factors"][j][k], b["factors"][j][k]) for k in a["factors"][j])


# ---- state (a run resumes bit for bit, warm or not: test_contract.py) ----------------------------
def test_bad_arguments_raise_naming_them():
    def peer(comm, **kwargs):
        PowerGossip([torch.zeros(4, 4)], comm, **kwargs)

    for kwargs, message in [
        ({"rank": 0}, "rank must be an integer >= 1"),
        ({"num_iterations": 0}, "num_iterations must be an integer >= 1"),
        ({"gamma": -1.0}, "gamma must be > 0"),
        ({"gamma": float("inf")}, "gamma must be finite and at most"),
        ({"gamma": 1e39}, r"gamma must be finite and at most 3\.403e\+38 \(float32\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            LocalCluster(topologies.ring(2)).run(peer, **kwargs)
