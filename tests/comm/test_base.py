"""comm/base.py's all-reduce, the one every transport runs: closed forms, the same bits on every
peer and transport, honest byte counts. The exchanges and the rest of `Communicator`:
tests/comm/test_local.py and the contract suite over every transport
(tests/algorithms/test_contract.py)."""

import pytest
import torch

import shared_launches
import topologies
from gossip_powersgd import CommunicationError, LocalCluster
from gossip_powersgd.comm import LocalCommunicator, ring_allreduce_bytes, ring_chunks

# Awkward sizes for 4 peers: fewer elements than peers, not divisible by 4, divisible, one element.
AWKWARD_SIZES = (1, 3, 5, 7, 30, 1001)


def test_chunks_cover_the_tensor_and_differ_by_at_most_one_element():
    for size in (1, 2, 3, 4, 6, 7):
        for numel in (0, 1, 2, 5, 29, 30, 1000):
            chunks = ring_chunks(numel, size)
            assert len(chunks) == size
            assert chunks[0][0] == 0 and chunks[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
            counts = [stop - start for start, stop in chunks]
            assert max(counts) - min(counts) <= 1


def test_every_peer_sends_the_same_bytes_when_the_tensor_allows_it():
    # n divides 2 numel: 30 floats on 4 peers is 15 per pair of chunks, so 45 floats for everyone
    assert {ring_allreduce_bytes(30, 8, 4, r) for r in range(4)} == {2 * 3 * 30 * 8 // 4}
    # otherwise the peers differ by one element, and together they send 2(n-1) x the tensor
    sent = [ring_allreduce_bytes(1000, 4, 6, r) for r in range(6)]
    assert max(sent) - min(sent) == 4 and sum(sent) == 2 * 5 * 4000
    assert ring_allreduce_bytes(1000, 4, 1, 0) == 0


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_sum_of_rank_values_is_the_closed_form(n):
    def peer(comm):
        x = torch.full((5, 3), float(comm.rank), dtype=torch.float64)
        total = comm.allreduce_(x.clone(), "sum")
        mean = comm.allreduce_(x.clone(), "mean")
        low = comm.allreduce_(x.clone(), "min")
        high = comm.allreduce_(x.clone(), "max")
        return total, mean, low, high

    for total, mean, low, high in LocalCluster(topologies.ring(n)).run(peer):
        assert torch.equal(total, torch.full((5, 3), n * (n - 1) / 2, dtype=torch.float64))
        assert torch.equal(mean, torch.full((5, 3), (n - 1) / 2, dtype=torch.float64))
        assert torch.equal(low, torch.zeros(5, 3, dtype=torch.float64))
        assert torch.equal(high, torch.full((5, 3), n - 1.0, dtype=torch.float64))


def awkward_allreduces(comm):
    """Random float32 data of awkward sizes, reduced with every op (run on every transport)."""
    out = {}
    for numel in AWKWARD_SIZES:
        g = torch.Generator().manual_seed(1000 * numel + comm.rank)
        x = torch.randn(numel, generator=g)
        for op in ("sum", "mean", "min", "max"):
            out[f"{op}-{numel}"] = comm.allreduce_(x.clone(), op)
    # a non-contiguous tensor is reduced in place too
    base = torch.arange(12.0).reshape(3, 4) * (comm.rank + 1)
    out["transposed"] = comm.allreduce_(base.t(), "sum").clone()
    out["bytes"] = torch.tensor([comm.stats.bytes_sent, comm.stats.messages_sent])
    return out


def test_awkward_sizes_give_the_same_bits_on_every_peer_and_the_right_values():
    results = LocalCluster(topologies.ring(4)).run(awkward_allreduces)
    for numel in AWKWARD_SIZES:
        data = torch.stack(
            [
                torch.randn(numel, generator=torch.Generator().manual_seed(1000 * numel + r))
                for r in range(4)
            ]
        )
        for op, want in (
            ("sum", data.sum(0)),
            ("mean", data.mean(0)),
            ("min", data.min(0).values),
            ("max", data.max(0).values),
        ):
            got = [r[f"{op}-{numel}"] for r in results]
            assert all(torch.equal(g, got[0]) for g in got), (op, numel)
            torch.testing.assert_close(got[0], want, rtol=1e-6, atol=1e-6)
    expected = torch.arange(12.0).reshape(3, 4).t() * (1 + 2 + 3 + 4)
    assert all(torch.equal(r["transposed"], expected) for r in results)


def test_counted_bytes_are_the_bytes_that_moved(monkeypatch):
    moved = {}
    original = LocalCommunicator._sendrecv

    def counting_sendrecv(self, dest, send, source, recv):
        if dest is not None:
            bytes_, messages = moved.get(self.rank, (0, 0))
            moved[self.rank] = (bytes_ + send.numel() * send.element_size(), messages + 1)
        original(self, dest, send, source, recv)

    monkeypatch.setattr(LocalCommunicator, "_sendrecv", counting_sendrecv)
    # the point-to-point ring that MPI and torch run (in-process runs use shared memory, below)
    monkeypatch.setattr(LocalCommunicator, "shared_memory_allreduce", False)
    results = LocalCluster(topologies.ring(4)).run(awkward_allreduces)
    for rank, r in enumerate(results):
        assert tuple(r["bytes"].tolist()) == moved[rank]
        predicted = 4 * sum(ring_allreduce_bytes(numel, 4, 4, rank) for numel in AWKWARD_SIZES)
        assert r["bytes"][0] == predicted + ring_allreduce_bytes(12, 4, 4, rank)
    # a single float on 4 peers moves through 3 reduce-scatter and 3 all-gather hops in all
    total_one = sum(ring_allreduce_bytes(1, 4, 4, rank) for rank in range(4))
    assert total_one == 2 * 3 * 4


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_shared_memory_all_reduce_is_the_point_to_point_ring_bit_for_bit(n, monkeypatch):
    """In-process peers reduce through shared memory: same bits, same counters as the ring."""

    def peer(comm):
        out = awkward_allreduces(comm)
        out["stats"] = torch.tensor(list(comm.stats.as_dict().values()))
        return out

    shared = LocalCluster(topologies.ring(n)).run(peer)
    monkeypatch.setattr(LocalCommunicator, "shared_memory_allreduce", False)
    ring = LocalCluster(topologies.ring(n)).run(peer)
    for a, b in zip(shared, ring):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), [
            k for k in a if not torch.equal(a[k], b[k])
        ]


def test_metric_all_reduce_charges_the_metric_counters_only():
    def peer(comm):
        comm.allreduce_(torch.zeros(8), "mean", metric=True)
        return comm.stats.as_dict()

    for rank, stats in enumerate(LocalCluster(topologies.ring(4)).run(peer)):
        assert stats["bytes_sent"] == stats["messages_sent"] == stats["rounds"] == 0
        assert stats["metric_bytes_sent"] == ring_allreduce_bytes(8, 4, 4, rank) == 2 * 3 * 8
        assert stats["metric_messages_sent"] == 6


def test_mismatched_sizes_fail_naming_a_peer_instead_of_hanging():
    def peer(comm):
        comm.allreduce_(torch.zeros(9 if comm.rank == 2 else 8), "sum")

    # rank 2's chunks differ from its ring neighbours' (1 and 3): whichever notices first names it
    with pytest.raises(
        CommunicationError, match=r"rank [123]: message from peer [123] has \d+ bytes, expected"
    ):
        LocalCluster(topologies.ring(4), timeout=5).run(peer)


@pytest.mark.mpi
def test_mpi_ring_allreduce_is_bit_equal_to_local(tmp_path_factory):
    # awkward_allreduces under mpiexec on ring:4, launched with the other ring:4 comparisons
    mpi = [r["allreduce"] for r in shared_launches.ring4("mpi", tmp_path_factory)]
    local = [r["allreduce"] for r in shared_launches.ring4_local()]
    for a, b in zip(mpi, local):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
