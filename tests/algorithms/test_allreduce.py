"""Centralized baselines: AllReduce (exact parameter averaging) and PowerSGDAllReduce (PowerSGD on
the gradients with error feedback). MPI == in-process and a resumed state: the contract every
registered algorithm keeps, tests/algorithms/test_contract.py."""

import pytest
import torch

import topologies
from gossip_powersgd import AllReduce, LocalCluster, NonFiniteError, PowerSGDAllReduce
from gossip_powersgd.algorithms import make_algorithm
from gossip_powersgd.comm import ring_allreduce_bytes
from gossip_powersgd.errors import AgreementError
from tests.training.test_validation import train_cli


def peer_grads(comm, step=0, dtype=torch.float64):
    """Gradients for a linear layer, a conv layer, a bias and a wide matrix, seeded by (rank, step)."""
    g = torch.Generator().manual_seed(100 * step + comm.rank)
    return [
        torch.randn(6, 8, generator=g, dtype=dtype),
        torch.randn(5, 3, 2, 2, generator=g, dtype=dtype),
        torch.randn(6, generator=g, dtype=dtype),
        torch.randn(3, 10, generator=g, dtype=dtype),
    ]


def make_params(comm, dtype=torch.float64):
    return [torch.nn.Parameter(torch.zeros_like(t)) for t in peer_grads(comm, dtype=dtype)]


def set_grads(params, comm, step):
    for p, g in zip(params, peer_grads(comm, step, params[0].dtype)):
        p.grad = g


def mean_over_peers(results):
    return [torch.stack(ts).mean(0) for ts in zip(*results)]


# ---- AllReduce ---------------------------------------------------------------------------------------
def test_allreduce_makes_every_peer_the_mean_in_one_step():
    topology = topologies.torus(2, 3)

    def peer(comm):
        x = peer_grads(comm)
        algorithm = AllReduce(x, comm)
        algorithm.step()
        return x, algorithm.bytes_per_step(), comm.stats.bytes_sent

    results = LocalCluster(topology).run(peer)
    expected = mean_over_peers(LocalCluster(topology).run(peer_grads))
    numel = 48 + 60 + 6 + 30
    for x, per_step, sent in results:
        for a, b, first in zip(x, expected, results[0][0]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
            assert torch.equal(a, first)
        # ring all-reduce of the whole model: 2 (n-1)/n x bytes
        assert per_step == sent == 2 * 5 * numel * 8 // 6


# ---- PowerSGD ----------------------------------------------------------------------------------------
def test_powersgd_at_full_rank_is_exact_gradient_averaging():
    """rank = the smaller side, min_compression_rate = 0, start_iter = 0: every matrix is compressed
    and P P^T spans it, so the averaged gradients equal the exact mean at every step (the error
    memories e_i = M_i - mean M are non-zero, but average to zero, so they cancel in later means).
    rank 6 takes the QR path, rank <= 4 Gram-Schmidt. Agreement is to float32 tolerance although the
    data are float64: Gram-Schmidt divides by (norm + 1e-8), so P is orthonormal to ~1e-8 only
    (measured error ~6e-8 absolute on the 3 x 10 matrix)."""
    topology = topologies.ring(4)

    def peer(comm):
        params = make_params(comm)
        algorithm = PowerSGDAllReduce(params, comm, rank=6, min_compression_rate=0, start_iter=0)
        assert algorithm.compressed_names == ["param[0]", "param[1]", "param[3]"]
        averaged = []
        for step in range(4):
            set_grads(params, comm, step)
            algorithm.step()
            averaged.append([p.grad.clone() for p in params])
        return averaged

    results = LocalCluster(topology).run(peer)
    for step in range(4):
        expected = mean_over_peers(LocalCluster(topology).run(peer_grads, step))
        for rank_result in results:
            for got, want, first in zip(rank_result[step], expected, results[0][step]):
                torch.testing.assert_close(got, want, rtol=1.3e-6, atol=1e-5)
                assert torch.equal(got, first)  # every rank has the same bits


def test_powersgd_error_feedback_and_plain_warmup():
    """Before start_iter: plain exact averaging (no memory). After: e_new = (g + e_old) - P Q^T
    bit for bit, with P Q^T the averaged gradient every rank receives; 1-D tensors stay exact."""
    topology = topologies.ring(4)
    start_iter = 2

    def peer(comm):
        params = make_params(comm)
        algorithm = PowerSGDAllReduce(
            params, comm, rank=1, start_iter=start_iter, min_compression_rate=1
        )
        records = []
        for step in range(5):
            set_grads(params, comm, step)
            raw = [p.grad.clone() for p in params]
            memory_before = {n: e.clone() for n, e in algorithm.error_memory().items()}
            predicted = algorithm.bytes_per_step()
            sent_before = comm.stats.bytes_sent
            algorithm.step()
            records.append(
                {
                    "raw": raw,
                    "out": [p.grad.clone() for p in params],
                    "memory_before": memory_before,
                    "memory_after": {n: e.clone() for n, e in algorithm.error_memory().items()},
                    "bytes": (predicted, comm.stats.bytes_sent - sent_before),
                }
            )
        return records, algorithm.compressed_names

    results = LocalCluster(topology).run(peer)
    compressed = results[0][1]
    # min_compression_rate=1 at rank 1: 6x8, 5x12 and 3x10 compress; the bias does not
    assert compressed == ["param[0]", "param[1]", "param[3]"]
    index = {name: k for k, name in enumerate(["param[0]", "param[1]", "param[2]", "param[3]"])}
    for step in range(5):
        exact_mean = mean_over_peers([r[0][step]["raw"] for r in results])
        for records, _ in results:
            record = records[step]
            predicted, sent = record["bytes"]
            assert predicted == sent
            if step < start_iter:
                for got, want in zip(record["out"], exact_mean):
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
                assert all(bool((e == 0).all()) for e in record["memory_after"].values())
                assert sent == 2 * 3 * (48 + 60 + 6 + 30) * 8 // 4
                continue
            for name, k in index.items():
                out = record["out"][k]
                assert torch.equal(out, results[0][0][step]["out"][k])
                if name in compressed:
                    m = torch.add(record["raw"][k], record["memory_before"][name])
                    assert torch.equal(record["memory_after"][name], torch.sub(m, out))
                    assert torch.linalg.matrix_rank(out.reshape(out.shape[0], -1)) <= 1
                else:
                    torch.testing.assert_close(out, exact_mean[k], rtol=0, atol=1e-14)
            # P (6 + 5 + 3 rows) and the bias in one all-reduce, Q (8 + 12 + 10 cols) in another
            assert sent == 2 * 3 * (14 + 6) * 8 // 4 + 2 * 3 * 30 * 8 // 4


def test_powersgd_error_feedback_recovers_the_mean_over_time():
    """With rank 1 the per-step average is biased, but error feedback returns what was held back:
    the running sum of the transmitted averages tracks the running sum of the exact means up to the
    (bounded) mean error memory: sum_t out_t = sum_t mean(g_t) - mean(e_T) exactly in exact arithmetic."""
    topology = topologies.ring(4)

    def peer(comm):
        params = make_params(comm)
        algorithm = PowerSGDAllReduce(params, comm, rank=1, start_iter=0, min_compression_rate=0)
        sums = [torch.zeros_like(p) for p in params]
        for step in range(6):
            set_grads(params, comm, step)
            algorithm.step()
            for s, p in zip(sums, params):
                s.add_(p.grad)
        return sums, {n: e.clone() for n, e in algorithm.error_memory().items()}

    results = LocalCluster(topology).run(peer)
    exact = [
        sum(ts)
        for ts in zip(
            *[mean_over_peers(LocalCluster(topology).run(peer_grads, s)) for s in range(6)]
        )
    ]
    mean_memory = mean_over_peers([[r[1][f"param[{k}]"] for k in (0, 1, 3)] for r in results])
    for k, memory in zip((0, 1, 3), mean_memory):
        torch.testing.assert_close(
            results[0][0][k], exact[k] - memory.view(exact[k].shape), rtol=0, atol=1e-10
        )


def test_powersgd_warm_start_keeps_q_and_state_resumes():
    topology = topologies.ring(3)

    def peer(comm):
        params = make_params(comm)
        warm = PowerSGDAllReduce(params, comm, rank=2, start_iter=0)
        set_grads(params, comm, 0)
        warm.step()
        q_after = {n: q.clone() for n, q in warm.factors().items()}
        state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in warm.state_dict().items()}
        outputs = []
        for step in (1, 2):
            set_grads(params, comm, step)
            warm.step()
            outputs.append([p.grad.clone() for p in params])
        resumed = PowerSGDAllReduce(params, comm, rank=2, start_iter=0)
        resumed.load_state_dict(state)
        resumed_q = {n: q.clone() for n, q in resumed.factors().items()}
        again = []
        for step in (1, 2):
            set_grads(params, comm, step)
            resumed.step()
            again.append([p.grad.clone() for p in params])
        return q_after, resumed_q, outputs, again

    for q_after, resumed_q, outputs, again in LocalCluster(topology).run(peer):
        assert q_after.keys() == resumed_q.keys()
        assert all(torch.equal(q_after[n], resumed_q[n]) for n in q_after)
        assert all(torch.equal(a, b) for x, y in zip(outputs, again) for a, b in zip(x, y))


def test_powersgd_names_a_missing_gradient_and_refuses_non_finite_ones():
    def missing(comm):
        params = make_params(comm)
        set_grads(params, comm, 0)
        params[2].grad = None
        PowerSGDAllReduce(
            list(zip(["fc.weight", "conv.weight", "fc.bias", "head.weight"], params)), comm
        ).step()

    with pytest.raises(ValueError, match="parameter fc.bias has no gradient"):
        LocalCluster(topologies.ring(3)).run(missing)

    def nan(comm):
        params = make_params(comm)
        algorithm = PowerSGDAllReduce(params, comm, start_iter=0)
        set_grads(params, comm, 0)
        if comm.rank == 0:
            params[1].grad[0, 0, 0, 0] = float("nan")
        algorithm.step()

    with pytest.raises(
        NonFiniteError, match=r"rank 0: non-finite values in the gradient\(s\) of param\[1\]"
    ):
        LocalCluster(topologies.ring(3)).run(nan)


def test_powersgd_leaves_frozen_parameters_out():
    """A frozen parameter (requires_grad=False) gets no gradient from backward(): PowerSGD leaves
    it out (its .grad stays None, its bytes are not sent) and does, bit for bit and byte for byte,
    what it does when only the others are passed; a model with nothing to train is refused."""

    def peer(comm, freeze, pass_frozen=True):
        params = make_params(comm)
        for k in freeze:
            params[k].requires_grad_(False)
        passed = [p for p in params if pass_frozen or p.requires_grad]
        algorithm = PowerSGDAllReduce(passed, comm, rank=2, start_iter=1)
        sent = []
        for step in range(3):  # a plain step, then two compressed ones
            set_grads(params, comm, step)
            for k in freeze:
                params[k].grad = None
            sent.append(algorithm.bytes_per_step())
            algorithm.step()
        return [p.grad for p in params], sent

    topology = topologies.ring(3)
    for (grads, sent), (alone, sent_alone) in zip(
        LocalCluster(topology).run(peer, [1]), LocalCluster(topology).run(peer, [1], False)
    ):
        assert grads[1] is None and sent == sent_alone
        assert all(torch.equal(a, b) for k, (a, b) in enumerate(zip(grads, alone)) if k != 1)

    with pytest.raises(ValueError, match="PowerSGDAllReduce: all 4 parameters are frozen"):
        LocalCluster(topology).run(peer, [0, 1, 2, 3])


def test_powersgd_follows_every_algorithms_rule_for_plain_and_frozen_tensors():
    """The rule of `algorithms/frozen.py`: only an nn.Parameter with requires_grad=False is left
    out. A plain tensor is averaged whatever its requires_grad (its .grad set by hand: before, it
    was left out and the peers' gradients stayed different, silently); one without a .grad is
    refused in one line; frozen values that differ between peers are refused at construction (no
    all-reduce ever touches them), and unfreezing one after construction at the step."""
    topology = topologies.ring(3)

    def plain(comm, with_grad=True):
        matrix = torch.nn.Parameter(torch.zeros(6, 8, dtype=torch.float64))
        vector = torch.zeros(6, dtype=torch.float64)  # a plain tensor: requires_grad=False
        algorithm = PowerSGDAllReduce([matrix, vector], comm, start_iter=1)
        matrix.grad = peer_grads(comm)[0]
        if with_grad:
            vector.grad = peer_grads(comm)[2]
        algorithm.step()  # a plain (exact) step
        return matrix.grad, vector.grad

    expected = mean_over_peers(LocalCluster(topology).run(peer_grads))
    for got in LocalCluster(topology).run(plain):
        # the ring and torch.mean add 3 float64 values (|g| < 6) in other orders: each sum is off
        # by at most 2 roundings of 18 (2 x 2^-48 = 7e-15), a third of that after the division
        torch.testing.assert_close(list(got), [expected[0], expected[2]], rtol=0, atol=5e-15)
    with pytest.raises(ValueError, match=r"rank \d: parameter param\[1\] has no gradient"):
        LocalCluster(topology).run(plain, False)

    def frozen(comm, differ=False, unfreeze=False):
        params = make_params(comm)
        params[1].requires_grad_(False)
        if differ:
            params[1].data.fill_(comm.rank)
        algorithm = PowerSGDAllReduce(params, comm, start_iter=1)
        set_grads(params, comm, 0)
        params[1].grad = None
        params[1].requires_grad_(unfreeze)
        algorithm.step()

    with pytest.raises(AgreementError, match="frozen parameters' values differs across ranks"):
        LocalCluster(topology).run(frozen, True)
    with pytest.raises(ValueError, match=r"param\[1\] was frozen when the algorithm was built"):
        LocalCluster(topology).run(frozen, False, True)
    LocalCluster(topology).run(frozen)  # equal frozen values, still frozen: runs


def test_powersgd_refuses_a_rate_that_compresses_none_of_what_its_default_compresses(tmp_path):
    """min_compression_rate=1e9 compresses nothing: the run would be an exact all-reduce labelled
    PowerSGD. Refused in one line naming the largest rate (12x9 at rank 1: 108/21 = 5.142857) and a
    bound below which it compresses (5.142 does, in fewer bytes); the CLI set-up refuses it the
    same way. A model whose matrices the default (2, PyTorch's) compresses none of (3x3 at rank 1:
    9/6 = 1.5) is not refused at any rate: PowerSGD keeps such matrices exact by design."""

    def peer(comm, rate, shape=(12, 9)):
        params = [torch.nn.Parameter(torch.zeros(shape)), torch.nn.Parameter(torch.zeros(7))]
        algorithm = PowerSGDAllReduce(params, comm, min_compression_rate=rate, start_iter=0)
        return algorithm.compressed_names, algorithm.bytes_per_step()

    def run(rate, shape=(12, 9)):
        return LocalCluster(topologies.ring(3)).run(peer, rate, shape)[0]

    with pytest.raises(
        ValueError, match=r"1e\+09 compresses no parameter \(the largest rate of th"
    ):
        run(1e9)
    with pytest.raises(
        ValueError,
        match=r"at rank 1 is 5.14286\), so the run would be an exact all-reduce of the gradients: "
        r"set min_compression_rate below 5.142 \(2 compresses what gets over 2x smaller\)",
    ):
        run(5.143)
    names, sent = run(5.142)
    assert names == ["param[0]"] and sent < ring_allreduce_bytes(12 * 9 + 7, 4, 3, 0)
    assert run(1e9, (3, 3)) == ([], ring_allreduce_bytes(3 * 3 + 7, 4, 3, 0))
    with pytest.raises(ValueError, match="compresses no parameter .* or raise start_iter"):
        train_cli(tmp_path, "algorithm=powersgd:min_compression_rate=1e9")


def test_make_algorithm_builds_the_centralized_baselines():
    def peer(comm):
        params = make_params(comm)
        plain = make_algorithm("allreduce", params, comm)
        powersgd = make_algorithm("powersgd:rank=4,start_iter=10,warm=true", params, comm)
        with pytest.raises(ValueError, match="unknown option 'gamma'; valid: none"):
            make_algorithm("allreduce:gamma=1", params, comm)
        with pytest.raises(
            ValueError, match="valid: min_compression_rate, rank, seed, start_iter, warm"
        ):
            make_algorithm("powersgd:iters=2", params, comm)
        return plain, powersgd

    plain, powersgd = LocalCluster(topologies.ring(3)).run(peer)[0]
    assert isinstance(plain, AllReduce) and isinstance(powersgd, PowerSGDAllReduce)
    assert (powersgd.rank, powersgd.start_iter, powersgd.warm_start) == (4, 10, True)
    assert powersgd.acts_on == "gradients" and plain.acts_on == "parameters"


# MPI == in-process for both baselines: tests/algorithms/test_contract.py.
