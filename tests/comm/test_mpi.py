"""The MPI transport (comm/mpi.py): the closed form of a step and bit-equality with the in-process
cluster, bad inputs failing on every rank, a wrong message size and a silent peer ending the job
naming the peer."""

import pytest
import torch

import shared_launches
import topologies
from gossip_powersgd import LocalCluster
from tests.comm.test_local import exact_gossip_run
from tests.conftest import SUPPORT, run_mpi, run_scenario_mpi


@pytest.mark.mpi
def test_mpi_closed_form_and_equality_with_local(tmp_path_factory):
    # rank_valued_step under mpiexec on ring:4, launched with the other ring:4 comparisons
    mpi = [r["rank_valued"] for r in shared_launches.ring4("mpi", tmp_path_factory)]
    local = [r["rank_valued"] for r in shared_launches.ring4_local()]
    for i in range(4):
        expected = (i + (i - 1) % 4 + (i + 1) % 4) / 3
        assert torch.allclose(mpi[i], torch.full_like(mpi[i], expected), rtol=0, atol=1e-12)
        assert torch.equal(mpi[i], local[i])


@pytest.mark.mpi
def test_mpi_exact_gossip_is_bit_equal_to_local(tmp_path):
    mpi = run_scenario_mpi(4, "tests.comm.test_local:exact_gossip_run", "torus:2x2", tmp_path)
    local = LocalCluster(topologies.torus(2, 2)).run(exact_gossip_run)
    for a, b in zip(mpi, local):
        assert all(torch.equal(x, y) for x, y in zip(a["x"], b["x"]))
        assert torch.equal(a["errors"], b["errors"]) and a["bytes"] == b["bytes"]


@pytest.mark.parametrize(
    "case, n, message",
    [
        (
            "world_size",
            3,
            "MPI world size 3 does not match the topology's 8 peers: run mpiexec -n 8",
        ),
        (
            "topologies_differ",
            3,
            "topology differs across ranks: ranks 0-1 hold variant 1; ranks 2 hold variant 2",
        ),
        (
            "shapes_differ",
            3,
            "parameter shapes and dtypes differs across ranks: ranks 0-1 hold variant 1; "
            "ranks 2 hold variant 2",
        ),
    ],
)
@pytest.mark.mpi
def test_mpi_bad_inputs_fail_on_every_rank(case, n, message):
    result = run_mpi(n, [SUPPORT / "mpi_bad_inputs.py", case], timeout=60)
    assert result.returncode != 0
    for rank in range(n):
        assert f"error (rank {rank}): {message}" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.mpi
def test_mpi_wrong_message_size_ends_the_job_naming_the_peer():
    result = run_mpi(3, [SUPPORT / "mpi_bad_inputs.py", "message_size"], timeout=60)  # ring:3
    assert result.returncode != 0
    assert "message from peer 1 has 28 bytes, expected 20" in result.stderr, result.stderr[-2000:]


@pytest.mark.mpi
def test_mpi_allreduce_with_another_op_on_one_rank_names_it_not_a_mixed_result():
    result = run_mpi(2, [SUPPORT / "mpi_bad_inputs.py", "ops_differ"], timeout=60)
    assert result.returncode != 0
    for rank, here, there, peer in ((0, "sum", "mean", 1), (1, "mean", "sum", 0)):
        assert (
            f"error (rank {rank}): rank {rank}: all-reduce with op {here!r} here, but peer {peer} "
            f"reduces with {there!r}"
        ) in result.stderr, result.stderr[-2000:]


@pytest.mark.mpi
@pytest.mark.timing
def test_mpi_silent_peer_ends_the_job_naming_it():
    result = run_mpi(4, [SUPPORT / "mpi_bad_inputs.py", "silent_peer"], timeout=60)
    assert result.returncode != 0
    assert "no message from neighbour(s) [2] within 3 s" in result.stderr, result.stderr[-2000:]
