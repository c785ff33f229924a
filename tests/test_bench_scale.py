"""Smoke tests of the scaling benchmark (tiny sizes) and of the GPU check's CPU-side code path."""

import json
import os
import subprocess
import sys

import pytest
import torch

import topologies
from conftest import ROOT
from experiments import gpu_check
from experiments.bench_scale import KINDS, main, peer_point, render_markdown, slope, summarize
from gossip_powersgd import LocalCluster
from gossip_powersgd.comm import ring_allreduce_bytes


def test_every_kind_charges_what_it_moves():
    n = 4
    records = LocalCluster(topologies.ring(n)).run(peer_point, KINDS, "100", 2)
    numel = records[0]["numel"]
    assert numel == 100
    for record in records:
        r = record["rank"]
        got = {row["kind"]: row for row in record["results"]}
        assert got["exact"]["bytes_sent"] == got["exact"]["bytes_received"] == 2 * numel * 4
        assert got["ring"]["bytes_sent"] == ring_allreduce_bytes(numel, 4, n, r)
        assert got["ring"]["bytes_received"] == ring_allreduce_bytes(numel, 4, n, (r - 1) % n)
        # The all-gather reduction receives every other peer's whole tensor.
        assert got["gather"]["bytes_received"] == got["gather"]["bytes_sent"] == (n - 1) * numel * 4
        assert got["powergossip"]["bytes_sent"] < got["exact"]["bytes_sent"] / 4
        assert all(row["seconds_per_step"] > 0 for row in record["results"])


def test_gather_reduction_equals_ring_average():
    from experiments.bench_scale import gather_reduce_

    def both(comm):
        x = torch.randn(37, generator=torch.Generator().manual_seed(comm.rank))
        return gather_reduce_(comm, x.clone()), comm.allreduce_(x.clone(), "mean")

    for gathered, ring in LocalCluster(topologies.ring(5)).run(both):
        torch.testing.assert_close(gathered, ring)


def test_slope_recovers_exponents():
    assert slope([(1, 3.0), (10, 300.0), (100, 30000.0)]) == pytest.approx(2.0)
    assert slope([(8, 5.0), (256, 5.0)]) == pytest.approx(0.0)
    assert slope([(8, 5.0)]) is None


def test_tiny_plan_writes_page_and_json(tmp_path):
    out = tmp_path / "scale.md"
    assert main(["--plan", "tiny", "--out", str(out), "--timeout", "300"]) == 0
    page = out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    assert not [r for r in data["records"] if "error" in r]
    for heading in (
        "## Cost vs number of peers",
        "## Ring all-reduce vs the all-gather reduction",
        "## Cost vs model size",
        "## Growth rates",
    ):
        assert heading in page
    assert render_markdown(data["records"], data["meta"]) == page
    # each in-process point records whether its threads took turns, and the page marks those
    turns = [r["point"]["peers"] > os.cpu_count() for r in data["records"]]
    assert [r["ranks"][0]["takes_turns"] for r in data["records"]] == turns
    assert ("‡ the peer threads took turns" in page) == any(turns)
    summary = summarize(data["records"][0])
    assert set(summary) == set(KINDS)


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
