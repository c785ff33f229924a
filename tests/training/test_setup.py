"""Run set-up (training/setup.py): peers whose dataset returns different data on different ranks
(unseeded randomness) fail on every rank, naming the ranks."""

import pytest

from tests.conftest import (
    TINY,
    tiny_config,
)
from tests.conftest import errors_on_every_rank as every_rank


def test_peers_that_load_different_data_fail_naming_the_ranks(monkeypatch):
    """Bad input 13: threads share a dataset cache; uncached, each peer loads its own, as separate
    processes do, and the BYO function returns other data on every call."""
    from gossip_powersgd.training import data

    monkeypatch.setattr(data, "load_dataset", lambda name, seed=0: data._build_dataset(name, seed))
    errors = every_rank(tiny_config("dataset=reliability_fixtures:per_call_data"))
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith("AgreementError: dataset differs across ranks: ranks ")
    assert "usually unseeded randomness" in errors[0] and "\n" not in errors[0]


@pytest.mark.mpi
def test_mpi_ranks_with_unseeded_data_fail_on_every_rank(tmp_path):
    """Bad input 13 under mpiexec: numpy's global random state differs per rank."""
    from tests.conftest import run_mpi

    result = run_mpi(
        4,
        [
            "-m",
            "experiments.train",
            "--config",
            TINY,
            "--set",
            "backend=mpi",
            "--set",
            "dataset=reliability_fixtures:unseeded_data",
            "--set",
            f"out_dir={tmp_path / 'run'}",
            "--quiet",
        ],
        timeout=180,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("error (rank")]
    assert result.returncode != 0
    assert sorted(line.split(")")[0] for line in lines) == [f"error (rank {r}" for r in range(4)], (
        result.stderr[-2000:]
    )
    assert all("dataset differs across ranks" in line and "unseeded" in line for line in lines)
    assert "Traceback" not in result.stderr
