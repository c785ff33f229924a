"""experiments/gpu_check.py, the prepared GPU check: its refusal without CUDA, its comparison, and
its CPU dry run (the same code path: local and torch/gloo transports)."""

import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from experiments import gpu_check


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_gpu_check_refuses_without_cuda_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "experiments.gpu_check"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: gpu_check needs CUDA")
    assert "--device cpu --dry-run" in result.stderr


def test_gpu_check_compare_catches_a_wrong_model_and_a_moved_average():
    shapes = gpu_check.check_shapes(dry_run=True)
    reference = gpu_check.run_local(2, "exact", shapes, 2, "cpu")
    assert gpu_check.compare(reference, reference, shapes, "exact")["ok"]
    wrong = [{"params": [p + 1e-3 * (k + 1) for p in r["params"]]} for k, r in enumerate(reference)]
    result = gpu_check.compare(wrong, reference, shapes, "exact")
    assert not result["ok"] and result["model_diff"] > 1e-5 and result["average_drift"] > 1e-5


def test_gpu_check_dry_run_passes_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.md"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.gpu_check",
            "--device",
            "cpu",
            "--dry-run",
            "--peers",
            "2",
            "--steps",
            "2",
            "--timeout",
            "240",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    page = out.read_text()
    assert page.count("| pass |") == 4  # local and torch/gloo, both algorithms
    assert "torch/gloo, 2 processes" in page and "## Time per gossip step" in page
