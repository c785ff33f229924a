"""Smoke test of experiments/bench_gossip.py: its core on a tiny parameter set, 2 steps, LocalCluster.

No timing assertions: only that the fields are there and that the bytes the transport counted equal
`bytes_per_step()` and the message-size formula.
"""

import json

import pytest
import torch

import topologies
from experiments.bench_gossip import (
    BenchConfig,
    isolated_benchmark,
    peer_benchmark,
    render_markdown,
    summarize_setting,
)
from experiments.bench_gossip.shapes import model_shapes
from gossip_powersgd import LocalCluster
from gossip_powersgd.training.models import build_model

# Two compressed matrices of different shapes (one of them a conv weight) and one 1-D tensor.
SHAPES = [("w", (8, 6)), ("conv", (4, 3, 2, 2)), ("bias", (8,))]


def test_bench_core_on_a_tiny_parameter_set():
    torch.set_num_threads(1)
    cfg = BenchConfig(
        model="tiny",
        topology="torus:2x4",
        backend="local",
        steps=2,
        reps=1,
        naive=True,
        exact_steps=1,
        warmup=0,
        concurrent_copy_mb=1,
        isolated_copy_mb=1,
        shapes=SHAPES,
    )
    topology = topologies.parse(cfg.topology)
    peers = LocalCluster(topology, timeout=60).run(peer_benchmark, cfg)
    iso = isolated_benchmark(cfg, topology)
    s = summarize_setting(cfg, peers, iso)
    s["seconds"] = 0.0
    json.dumps(s)  # the raw results must be JSON-serialisable too
    json.dumps(peers)

    degree = 3  # torus:2x4: the size-2 dimension wraps onto one neighbour
    assert s["degree"] == degree and s["peers"] == 8
    # Right half-step: sum of rows (8 + 4) floats per neighbour; left: sum of cols (6 + 12); both
    # carry the 8 floats of the 1-D tensor (one half-step per step). Exact: all 104 floats.
    right, left, exact = (12 + 8) * degree * 4, (18 + 8) * degree * 4, 104 * degree * 4
    for p in peers:
        for name in ("batched", "naive"):
            steps = [st for block in p["variants"][name] for st in block["steps"]]
            assert [st["side"] for st in steps] == ["right", "left"]
            assert (
                [st["bytes"] for st in steps] == [st["expected"] for st in steps] == [right, left]
            )
        assert p["exact"]["steps"][0]["bytes"] == p["exact"]["steps"][0]["expected"] == exact
    for name in ("batched", "naive"):
        v = s["variants"][name]
        assert v["bytes_match"] is True
        assert v["bytes"] == (right + left) / 2
        assert (v["bytes_right"], v["bytes_left"]) == (right, left)
        assert v["bytes_ratio"] == exact / ((right + left) / 2)
        for key in ("total", "comm", "compute", "efficiency_in_situ", "reps"):
            assert key in v
        assert v["total"] >= v["compute"] >= 0
    assert s["exact"]["bytes_match"] is True and s["exact"]["bytes"] == exact
    assert s["compressed_bytes"] == (48 + 48) * 4
    assert set(s["speedup"]) == {"compute", "total"}
    assert s["bandwidth_concurrent"] > 0
    isolated = s["isolated"]
    assert isolated["degree"] == degree and isolated["bandwidth"] > 0
    for name in ("batched", "naive"):
        for side in ("all", "right", "left"):
            assert set(isolated["variants"][name][side]) == {"compute", "efficiency"}
    assert "speedup" in isolated

    text = render_markdown(
        "python -m experiments.bench_gossip (test)",
        [{"summary": s, "raw": {}}],
        {
            "cpu": "test",
            "cores": 1,
            "memory": "?",
            "load_average": None,
            "python": "3",
            "torch": torch.__version__,
            "torch_default_threads": 1,
            "mpi": "none",
        },
        None,
        "today",
        0.0,
    )
    assert "### tiny · torus:2x4 (degree 3) · backend local" in text
    assert "bytes ratio exact / PowerGossip" in text


@pytest.mark.parametrize(
    "model, spec", [("resnet20", "resnet20"), ("vgg16", "vgg16:bn=false"), ("vgg16_bn", "vgg16")]
)
def test_shapes_are_the_zoo_models_the_trainer_builds(model, spec):
    built = build_model(spec, (3, 32, 32), 10)
    assert model_shapes(model) == [(n, tuple(p.shape)) for n, p in built.named_parameters()]
