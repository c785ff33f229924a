"""The in-process cluster (comm/local.py): its closed forms, equality and failure modes, one
communicator's concurrent use, and peers that use torch's global RNG. The MPI transport:
test_mpi.py."""

import threading
import time

import pytest
import torch

import topologies
from gossip_powersgd import (
    AgreementError,
    CommunicationError,
    ExactGossip,
    LocalCluster,
    consensus_distance,
)
from gossip_powersgd.comm import LocalCommunicator, ring_allreduce_bytes
from tests.conftest import ROOT


# ---- in-process ------------------------------------------------------------------------------------
def test_run_returns_values_by_rank():
    assert LocalCluster(topologies.ring(5)).run(lambda comm: comm.rank * 10) == [0, 10, 20, 30, 40]


def test_exchange_delivers_each_neighbours_value_and_counts_bytes():
    def peer(comm):
        send = {j: torch.full((3,), float(comm.rank)) for j in comm.neighbors}
        recv = {j: torch.empty(3) for j in comm.neighbors}
        comm.exchange(send, recv)
        return (
            {j: recv[j].tolist() for j in comm.neighbors},
            comm.stats.bytes_sent,
            comm.stats.messages_sent,
        )

    topology = topologies.torus(2, 3)
    for rank, (received, sent, messages) in enumerate(LocalCluster(topology).run(peer)):
        assert received == {j: [float(j)] * 3 for j in topology.neighbors(rank)}
        assert messages == len(topology.neighbors(rank))
        assert sent == messages * 3 * 4


def test_critical_path_counts_one_round_per_exchange_at_its_largest_message():
    def peer(comm):
        # neighbour j gets j + 1 floats: the largest message sets the round's cost
        send = {j: torch.zeros(j + 1) for j in comm.neighbors}
        recv = {j: torch.zeros(comm.rank + 1) for j in comm.neighbors}
        comm.exchange(send, recv)
        comm.allreduce_(torch.zeros(10))
        return comm.stats

    topology = topologies.ring(5)
    for rank, stats in enumerate(LocalCluster(topology).run(peer)):
        ring_allreduce = 2 * 4 * 40 // 5
        assert stats.rounds == 1 + 2 * 4
        assert stats.critical_bytes == 4 * (max(topology.neighbors(rank)) + 1) + ring_allreduce
        assert stats.projected_seconds(1e-3, 1e6) == pytest.approx(
            9e-3 + stats.critical_bytes / 1e6
        )


def test_allreduce_is_bit_identical_on_every_peer_and_not_charged_when_metric():
    def peer(comm):
        g = torch.Generator().manual_seed(comm.rank)
        x = torch.randn(1000, generator=g)
        mean = comm.allreduce_(x.clone(), "mean", metric=True)
        total = comm.allreduce_(x.clone(), "sum")
        high = comm.allreduce_(x.clone(), "max")
        return mean, total, high, x, comm.stats.as_dict()

    results = LocalCluster(topologies.ring(6)).run(peer)
    stacked = torch.stack([r[3] for r in results])
    for rank, (mean, total, high, _, stats) in enumerate(results):
        assert torch.equal(mean, results[0][0]) and torch.equal(total, results[0][1])
        assert torch.allclose(mean, stacked.mean(0), atol=1e-6)
        assert torch.allclose(total, stacked.sum(0), atol=1e-5)
        assert torch.equal(high, stacked.max(0).values)
        # ring all-reduce cost 2(n-1)/n x 4000 bytes, twice (sum and max), the mean on the metric
        # side; 1000 floats do not split evenly over 6 peers, so a peer sends within one float of it
        ring = ring_allreduce_bytes(1000, 4, 6, rank)
        assert abs(ring - 2 * 5 * 4000 / 6) <= 4
        assert stats["bytes_sent"] == 2 * ring
        assert stats["metric_bytes_sent"] == ring
    # and between them the peers send exactly 2(n-1) x the tensor per all-reduce
    assert sum(r[4]["metric_bytes_sent"] for r in results) == 2 * 5 * 4000


def test_a_failing_peer_releases_the_others_and_its_error_is_raised():
    def peer(comm):
        if comm.rank == 3:
            raise RuntimeError("boom on 3")
        comm.exchange(
            {j: torch.zeros(2) for j in comm.neighbors}, {j: torch.zeros(2) for j in comm.neighbors}
        )
        comm.barrier()

    with pytest.raises(RuntimeError, match="boom on 3"):
        LocalCluster(topologies.ring(6), timeout=60).run(peer)


def test_wrong_message_size_names_the_sending_peer():
    def peer(comm):
        size = 4 if comm.rank == 1 else 3
        comm.exchange(
            {j: torch.zeros(size) for j in comm.neighbors},
            {j: torch.zeros(3) for j in comm.neighbors},
        )

    with pytest.raises(CommunicationError, match="from peer 1 has 16 bytes, expected 12"):
        LocalCluster(topologies.ring(4)).run(peer)


def test_wrong_message_dtype_names_the_sending_peer():
    def peer(comm):
        dtype = torch.int32 if comm.rank == 2 else torch.float32
        comm.exchange(
            {j: torch.zeros(3, dtype=dtype) for j in comm.neighbors},
            {j: torch.zeros(3) for j in comm.neighbors},
        )

    with pytest.raises(CommunicationError, match="from peer 2 has dtype torch.int32"):
        LocalCluster(topologies.ring(4)).run(peer)


@pytest.mark.timing
def test_a_silent_neighbour_times_out_naming_it():
    def peer(comm):
        if comm.rank == 0:
            return  # never sends
        comm.exchange(
            {j: torch.zeros(1) for j in comm.neighbors}, {j: torch.zeros(1) for j in comm.neighbors}
        )

    with pytest.raises(CommunicationError, match="no message from neighbour 0 within 0.5 s"):
        LocalCluster(topologies.ring(4), timeout=0.5).run(peer)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_timeout_that_is_not_positive_and_finite_is_refused_not_a_hang(timeout):
    """A NaN deadline is never passed: before, a silent neighbour held the others for ever."""

    def peer(comm):
        if comm.rank == 0:
            return  # never sends
        comm.exchange(
            {j: torch.zeros(1) for j in comm.neighbors}, {j: torch.zeros(1) for j in comm.neighbors}
        )

    outcome = []

    def run():
        try:
            LocalCluster(topologies.ring(4), timeout=timeout, cooperative=False).run(peer)
        except Exception as exc:  # noqa: BLE001 - looked at below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), f"timeout={timeout}: a silent neighbour hung the run"
    assert len(outcome) == 1 and isinstance(outcome[0], ValueError), outcome
    assert str(outcome[0]).startswith(f"bad timeout {timeout!r}: it must be a positive, finite")


@pytest.mark.parametrize("kind", ["MPICommunicator", "TorchCommunicator"])
def test_the_launched_transports_refuse_a_nan_timeout_first(kind):
    """The same check, before any launcher or MPI is looked at (MPI waited with a NaN deadline,
    torch failed converting it to a timedelta: "cannot convert float NaN to integer")."""
    import gossip_powersgd.comm as comm_package

    with pytest.raises(ValueError, match="bad timeout nan: it must be a positive, finite"):
        getattr(comm_package, kind)(topologies.ring(2), timeout=float("nan"))


@pytest.mark.parametrize("shared_memory", [True, False])
def test_an_allreduce_with_another_op_on_one_peer_is_named_not_mixed(monkeypatch, shared_memory):
    """Rank 0 sums where the others average: before, every peer got chunk 1 summed and the rest
    averaged, silently (torch's header refused it; local and MPI did not)."""
    monkeypatch.setattr(LocalCommunicator, "shared_memory_allreduce", shared_memory)

    def peer(comm):
        return comm.allreduce_(torch.ones(5), op="sum" if comm.rank == 0 else "mean")

    with pytest.raises(CommunicationError) as info:
        LocalCluster(topologies.ring(4), timeout=10).run(peer)
    # the two peers that see the other op, rank 0 (from 3) and rank 1 (from 0), fail at once
    assert str(info.value) in [
        f"rank {rank}: all-reduce with op {here!r} here, but peer {left} reduces with {there!r} "
        "(do all peers run the same algorithm on the same model?)"
        for rank, here, left, there in ((0, "sum", 3, "mean"), (1, "mean", 0, "sum"))
    ]


def test_a_transposed_message_lands_in_a_flat_buffer_in_its_logical_order():
    """MPI and torch send a non-contiguous tensor's elements in logical order (`.contiguous()`);
    before, the local transport's copy kept the transposed strides and the flat receive buffer
    raised "view size is not compatible with input tensor's size and stride"."""
    sent = torch.arange(6.0).view(2, 3).t()

    def peer(comm):
        recv = {j: torch.zeros(6) for j in comm.neighbors}
        comm.exchange({j: sent for j in comm.neighbors}, recv)
        return recv

    for recv in LocalCluster(topologies.ring(3)).run(peer):
        for got in recv.values():
            assert torch.equal(got, sent.reshape(-1))


def test_disagreeing_parameter_shapes_fail_identically_on_every_peer():
    def peer(comm):
        rows = 6 if comm.rank in (1, 2) else 5
        try:
            ExactGossip([torch.zeros(rows, 3)], comm)
        except AgreementError as exc:
            return str(exc)
        return "no error"

    messages = LocalCluster(topologies.ring(5)).run(peer)
    assert len(set(messages)) == 1
    assert messages[0] == (
        "parameter shapes and dtypes differs across ranks: ranks 0,3-4 hold "
        "variant 1; ranks 1-2 hold variant 2"
    )


def test_exchange_requires_exactly_the_neighbours():
    def peer(comm):
        comm.exchange({comm.neighbors[0]: torch.zeros(1)}, {comm.neighbors[0]: torch.zeros(1)})

    with pytest.raises(ValueError, match="one send and one receive buffer per neighbour"):
        LocalCluster(topologies.ring(4)).run(peer)


# ---- exact gossip ----------------------------------------------------------------------------------
def rank_valued_step(comm, gamma="1.0"):
    """BlueFog's pattern: peer i holds the value i; one step has a closed-form result."""
    x = torch.full((3, 2), float(comm.rank), dtype=torch.float64)
    ExactGossip([x], comm, gamma=float(gamma)).step()
    return x


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_exact_gossip_one_step_closed_form_on_a_ring(gamma):
    n = 6
    results = LocalCluster(topologies.ring(n)).run(rank_valued_step, str(gamma))
    for i, x in enumerate(results):
        left, right = (i - 1) % n, (i + 1) % n
        expected = i + gamma * ((left - i) + (right - i)) / 3
        assert torch.allclose(x, torch.full_like(x, expected), rtol=0, atol=1e-12)


def random_peer_data(comm, dtype=torch.float64, shapes=((100, 100), (10,))):
    g = torch.Generator().manual_seed(42 + comm.rank)
    return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]


def exact_gossip_run(comm, steps="30"):
    x = random_peer_data(comm)
    gossip = ExactGossip(x, comm)
    errors = [consensus_distance(x, comm)]
    for _ in range(int(steps)):
        gossip.step()
        errors.append(consensus_distance(x, comm))
    return {"x": x, "errors": torch.tensor(errors), "bytes": comm.stats.bytes_sent}


def test_exact_gossip_preserves_the_average_and_converges():
    topology = topologies.torus(2, 4)
    before = LocalCluster(topology).run(lambda comm: random_peer_data(comm))
    after = LocalCluster(topology).run(exact_gossip_run)
    for k in range(2):
        mean_before = torch.stack([p[k] for p in before]).mean(0)
        mean_after = torch.stack([r["x"][k] for r in after]).mean(0)
        assert torch.allclose(mean_before, mean_after, rtol=0, atol=1e-12)
    errors = after[0]["errors"]
    assert errors[-1] < 1e-6 * errors[0]
    assert all(b < a for a, b in zip(errors.tolist(), errors.tolist()[1:]))
    # one message of the whole model (10,010 float64) to each of 3 neighbours per step
    assert after[0]["bytes"] == 30 * 3 * 10010 * 8


def test_single_peer_gossip_is_a_no_op():
    def peer(comm):
        x = [torch.arange(6.0).reshape(2, 3)]
        ExactGossip(x, comm).step()
        return x[0], consensus_distance(x, comm), comm.stats.bytes_sent

    ((x, distance, sent),) = LocalCluster(topologies.ring(1)).run(peer)
    assert torch.equal(x, torch.arange(6.0).reshape(2, 3)) and distance == 0 and sent == 0


def test_a_second_exchange_in_flight_on_one_communicator_is_an_error():
    """Peer 0 starts an exchange from a thread; peer 1 holds back its message until peer 0's main
    thread has tried a second exchange on the same communicator, which must raise at once."""
    second_tried = threading.Event()

    def peer(comm):
        send = {j: torch.full((4,), float(comm.rank)) for j in comm.neighbors}
        recv = {j: torch.empty(4) for j in comm.neighbors}
        if comm.rank == 1:
            assert second_tried.wait(timeout=30)
            comm.exchange(send, recv)
            return None
        worker = threading.Thread(target=comm.exchange, args=(send, recv))
        worker.start()
        while not comm._busy.locked():  # noqa: SLF001 - wait until the first exchange is in flight
            time.sleep(0.001)
        try:
            comm.exchange(send, {j: torch.empty(4) for j in comm.neighbors})
        except CommunicationError as exc:
            error = str(exc)
        else:
            error = None
        second_tried.set()
        worker.join(timeout=30)
        return error, float(recv[1][0])

    results = LocalCluster(topologies.ring(2), timeout=30).run(peer)
    error, received = results[0]
    assert error is not None and "already in the middle of an exchange" in error
    assert received == 1.0  # the first exchange still completed with the right message


def test_local_cluster_accepts_a_spec_and_names_what_it_needs():
    assert LocalCluster("ring:3").run(lambda comm: comm.neighbors) == [(1, 2), (0, 2), (0, 1)]
    with pytest.raises(TypeError, match="needs a topologies.Topology.*or a spec string"):
        LocalCluster(4)


def test_disagreeing_parameter_dtypes_fail_identically_on_every_peer():
    def peer(comm):
        dtype = torch.float64 if comm.rank == 1 else torch.float32
        try:
            ExactGossip([torch.zeros(5, 3, dtype=dtype)], comm)
        except AgreementError as exc:
            return str(exc)
        return "no error"

    messages = LocalCluster(topologies.ring(4)).run(peer)
    assert (
        messages
        == [
            "parameter shapes and dtypes differs across ranks: ranks 0,2-3 hold variant 1; "
            "ranks 1 hold variant 2"
        ]
        * 4
    )


def global_rng_peer(comm):
    torch.manual_seed(42 + comm.rank)  # the shared global generator: order depends on the threads
    return torch.randn(3)


def own_generator_peer(comm):
    g = torch.Generator().manual_seed(42 + comm.rank)
    return torch.randn(3, generator=g)


def rng_warnings(cluster, fn):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = cluster.run(fn)
    return results, [
        w
        for w in caught
        if issubclass(w.category, RuntimeWarning) and "global RNG" in str(w.message)
    ]


@pytest.mark.parametrize("kwargs", [dict(cooperative=False), dict(cooperative=True, lanes=2)])
def test_concurrent_peers_that_use_the_global_rng_are_warned_once(kwargs):
    from gossip_powersgd.comm.local import GLOBAL_RNG_WARNING

    _, caught = rng_warnings(LocalCluster(topologies.ring(4), **kwargs), global_rng_peer)
    assert [str(w.message) for w in caught] == [GLOBAL_RNG_WARNING]
    assert "\n" not in GLOBAL_RNG_WARNING and "own torch.Generator" in GLOBAL_RNG_WARNING
    runs = [
        rng_warnings(LocalCluster(topologies.ring(4), **kwargs), own_generator_peer)
        for _ in range(2)
    ]
    assert runs[0][1] == runs[1][1] == []
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))


def test_one_peer_at_a_time_may_use_the_global_rng_unwarned():
    _, caught = rng_warnings(LocalCluster(topologies.ring(4), cooperative=True), global_rng_peer)
    assert caught == []


def test_the_readme_example_is_bit_identical_when_peers_run_at_once():
    import re

    text = (ROOT / "README.md").read_text()
    block = re.search(r"## The library in 20 lines\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace = {}
    exec(block[: block.index("topology = ")], namespace)  # defines peer(comm), runs nothing
    results = []
    for kwargs in [dict(cooperative=True, lanes=2)] * 2 + [dict(cooperative=False)] * 2:
        values, caught = rng_warnings(LocalCluster(topologies.ring(8), **kwargs), namespace["peer"])
        assert caught == []
        results.append(values)
    assert all(r == results[0] for r in results)  # floats compared exactly: the same bits
