"""The hint for a launcher and a backend that do not match names the backend that would work."""

import pytest

from gossip_powersgd.cli.train import run


def test_mpi_backend_under_torchrun_points_to_the_torch_backend(monkeypatch, tmp_path):
    # What torchrun sets in every process it starts (no MPI launcher variables).
    for key, value in {
        "TORCHELASTIC_RUN_ID": "t",
        "RANK": "0",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "0",
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=r"torchrun started this process: add --set backend=torch"):
        run(["--config", "demo", "--set", f"out_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()  # refused before anything is written
