"""comm/transports.py: how a process tells which launcher started it (from the environment alone),
and the one-line refusal, with the command that works, of a transport started the wrong way
(registration itself: tests/test_registries.py, tests/comm/test_example_transport.py)."""

import sys
from pathlib import Path

import pytest

import topologies
from gossip_powersgd.comm.transports import (
    TRANSPORTS,
    Transport,
    launched_by_mpiexec,
    launched_by_torchrun,
    torchrun_world_size,
    transport,
)

MARKERS = (
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
)


@pytest.fixture
def plain(monkeypatch):
    """This process as if started by hand: no launcher's variables."""
    for name in MARKERS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_torchrun_is_told_by_its_run_id_or_by_rank_and_world_size_together(plain):
    assert not launched_by_torchrun() and torchrun_world_size() == 1
    plain.setenv("RANK", "0")
    assert not launched_by_torchrun()  # RANK alone is too common a name to mean torchrun
    plain.setenv("WORLD_SIZE", "4")
    assert launched_by_torchrun() and torchrun_world_size() == 4
    plain.setenv("WORLD_SIZE", "four")
    assert torchrun_world_size() == 1  # unreadable: no world to speak of
    plain.delenv("RANK")
    plain.delenv("WORLD_SIZE")
    plain.setenv("TORCHELASTIC_RUN_ID", "x")
    assert launched_by_torchrun() and torchrun_world_size() == 1


@pytest.mark.parametrize("marker", MARKERS[3:])
def test_each_mpi_launchers_variable_marks_an_mpi_rank(plain, marker):
    assert not launched_by_mpiexec()
    plain.setenv(marker, "0")
    assert launched_by_mpiexec() and not launched_by_torchrun()


def test_launched_transports_refuse_a_process_started_by_hand_with_the_command(plain):
    with pytest.raises(
        ValueError,
        match=r"^backend mpi runs one peer per MPI rank: launch with mpiexec -n 4 \S+ -m "
        r"gossip_powersgd\.cli\.train \.\.\., or use --set backend=local$",
    ):
        transport("mpi").check_started("gossip_powersgd.cli.train", 4)
    with pytest.raises(
        ValueError,
        match=r"^backend torch runs one peer per process: launch with torchrun "
        r"--nproc-per-node N -m \.\.\. \.\.\., or use backend local$",
    ):
        transport("torch").check_started(None, "N")
    transport("local").check_started("gossip_powersgd.cli.train", 4)  # by hand: fine


def test_each_launcher_is_refused_by_the_other_transports_naming_the_fix(plain):
    plain.setenv("RANK", "1")
    plain.setenv("WORLD_SIZE", "3")
    with pytest.raises(
        ValueError, match=r"but torchrun started this process: add --set backend=torch"
    ):
        transport("mpi").check_started("m", 3)
    with pytest.raises(
        ValueError, match=r"torchrun started 3 processes \(WORLD_SIZE=3\): use --set backend=torch"
    ):
        transport("local").check_started("m", 3)
    transport("torch").check_started("m", 3)
    plain.delenv("RANK")
    plain.delenv("WORLD_SIZE")
    plain.setenv("PMI_RANK", "0")
    transport("torch").check_started("m", 3)  # torch.distributed under mpiexec: its variables
    transport("mpi").check_started("m", 3)


def test_connect_refuses_a_world_of_another_size_than_the_topology():
    class Three(Transport):
        name, in_process, launcher = "three", False, "mylauncher"

        def world_size(self):
            return 3

        def communicator(self, topology, timeout, device):
            return ("built", topology.size)

    with pytest.raises(
        ValueError,
        match=r"^topology 'ring:4' has 4 peers but mylauncher started 3 processes: start 4$",
    ):
        Three().connect(topologies.parse("ring:4"), None, "cpu")
    assert Three().connect(topologies.parse("ring:3"), None, "cpu") == ("built", 3)
    with pytest.raises(ValueError, match="backend 'local' has no communicator per process"):
        transport("local").communicator(topologies.ring(2), None, "cpu")


def test_every_registered_transport_says_how_it_is_started():
    for name in ("local", "mpi", "torch"):
        entry = TRANSPORTS.get(name)
        assert entry.in_process == (entry.launcher is None), name
    python = Path(sys.executable).name
    assert transport("mpi").command(8, "pkg.cli") == f"mpiexec -n 8 {python} -m pkg.cli ..."
    assert transport("torch").command(2) == "torchrun --nproc-per-node 2 -m ... ..."
