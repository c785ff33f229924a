"""The launcher markers: a test that starts mpiexec or torchrun must say so (conftest.py checks
every process a test starts), so that `pytest -m "not mpi and not torchrun"` runs no launcher."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import launcher_marker


def test_launchers_are_recognised():
    assert launcher_marker(["/usr/bin/mpiexec", "-n", "4", sys.executable, "x.py"]) == "mpi"
    assert launcher_marker(["mpirun", "-n", "2", "a"]) == "mpi"
    assert (
        launcher_marker(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "x.py"]
        )
        == "torchrun"
    )
    assert launcher_marker(["torchrun", "--nproc-per-node", "2", "x.py"]) == "torchrun"
    assert launcher_marker([sys.executable, "-m", "experiments.train"]) is None
    assert launcher_marker("ls") is None


def test_a_launch_without_its_marker_fails_the_test(tmp_path):
    fake = tmp_path / "mpiexec"  # never started: the check comes first
    with pytest.raises(pytest.fail.Exception, match=r"starts mpiexec but has no @pytest.mark.mpi"):
        subprocess.run([str(fake), "-n", "2", sys.executable, "-c", "pass"])
    assert not fake.exists()


@pytest.mark.mpi
def test_a_marked_launch_goes_ahead(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\nexit 3\n")
    os.chmod(fake, 0o755)
    assert subprocess.run([str(fake)]).returncode == 3
