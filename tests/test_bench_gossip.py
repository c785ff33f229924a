"""Smoke test of experiments/bench_gossip.py: its core on a tiny parameter set, 2 steps, LocalCluster;
its --before path (an earlier commit's PowerGossip beside this tree's); its shapes come from the zoo.

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
from experiments.bench_gossip.measure import block_order, compare_params
from experiments.bench_gossip.shapes import model_shapes
from experiments.commit_code import previous_powergossip
from gossip_powersgd import LocalCluster
from gossip_powersgd.training.models import build_model

# The commit before Architecture II touched algorithms/ (what the committed page compares with).
BEFORE = "6df8d52"

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

    text = _page(s)
    assert "### tiny · torus:2x4 (degree 3) · backend local" in text
    assert "bytes ratio exact / PowerGossip" in text


def _page(summary: dict) -> str:
    """The page for one setting's summary, on a stand-in machine description."""
    machine = {
        "cpu": "test",
        "cores": 1,
        "memory": "?",
        "load_average": None,
        "python": "3",
        "torch": torch.__version__,
        "torch_default_threads": 1,
        "mpi": "none",
    }
    return render_markdown(
        "python -m experiments.bench_gossip (test)",
        [{"summary": summary, "raw": {}}],
        machine,
        None,
        "today",
        0.0,
    )


def _has_history() -> bool:
    return previous_powergossip(BEFORE, helpers=True) is not None


@pytest.mark.skipif(not _has_history(), reason=f"needs a clone with commit {BEFORE}")
def test_before_runs_the_earlier_commits_powergossip_beside_this_trees():
    torch.set_num_threads(1)
    cfg = BenchConfig(
        model="tiny",
        topology="ring:4",
        backend="local",
        steps=8,
        reps=4,  # four blocks of 2 steps: batched and before each come first after the copy twice
        naive=False,
        exact_steps=1,
        warmup=0,
        concurrent_copy_mb=1,
        isolated_copy_mb=1,
        shapes=SHAPES,
        before=BEFORE,
    )
    topology = topologies.parse(cfg.topology)
    peers = LocalCluster(topology, timeout=60).run(peer_benchmark, cfg)
    s = summarize_setting(cfg, peers, isolated_benchmark(cfg, topology))
    s["seconds"] = 0.0
    json.dumps(peers)
    b = s["before"]
    assert b["commit"] == BEFORE
    # The earlier commit's modules, not this tree's: its powergossip.py and the helpers it imports.
    assert {"powergossip", "kernels", "lowrank"} <= set(b["modules"])
    assert b["bytes_equal"] is True
    assert s["variants"]["before"]["bytes"] == s["variants"]["batched"]["bytes"]
    # Architecture II moved and renamed PowerGossip's code without changing an operation: after 8
    # steps on ring:4 every peer's parameters have the same bits as 6df8d52's.
    assert b["identical"] is True and b["max_difference"] == 0.0
    assert set(b["ratio"]) == {"compute", "total"} and all(r > 0 for r in b["ratio"].values())
    assert s["isolated"]["before_ratio"] > 0
    page = _page(s)
    assert f"## This tree's PowerGossip against `{BEFORE}`'s, in the same run" in page
    assert "| tiny · ring:4 · local | " in page
    assert "final parameters bit-identical in all settings: yes." in page
    assert f"PowerGossip r=1 batched, `{BEFORE}`" in page


def test_before_through_the_cli_and_a_bad_commit(tmp_path):
    from experiments.bench_gossip import run

    with pytest.raises(ValueError, match="--before no-such-commit: cannot read"):
        run(["--model", "resnet20", "--before", "no-such-commit"])
    with pytest.raises(ValueError, match="drop --bytes-only"):
        run(["--model", "resnet20", "--bytes-only", "--before", BEFORE])
    if not _has_history():
        return
    out = tmp_path / "page.md"
    argv = ["--model", "resnet20", "--topology", "ring:4", "--steps", "2", "--reps", "1"]
    assert run([*argv, "--no-isolated", "--before", BEFORE, "--out", str(out)]) == 0
    page = out.read_text()
    assert "| resnet20 · ring:4 · local | " in page
    assert "final parameters bit-identical in all settings: yes." in page
    raw = json.loads(out.with_suffix(".json").read_text())
    assert raw["settings"][0]["before"]["identical"] is True


def test_block_order_puts_batched_and_before_first_equally_often():
    names = ["batched", "before", "naive"]
    orders = [block_order(names, rep) for rep in range(4)]
    assert [o[0] for o in orders].count("batched") == [o[0] for o in orders].count("before") == 1
    positions = {n: sum(o.index(n) for o in orders) for n in names}
    assert positions["batched"] == positions["before"]
    # Without "before", the A B, B A alternation of the earlier pages.
    assert [block_order(["batched", "naive"], rep) for rep in range(3)] == [
        ["batched", "naive"],
        ["naive", "batched"],
        ["batched", "naive"],
    ]


def test_compare_params_is_bitwise():
    a = [torch.tensor([0.0, 1.0]), torch.ones(2, 2)]
    assert compare_params(a, [t.clone() for t in a]) == {"identical": True, "max_difference": 0.0}
    b = [torch.tensor([-0.0, 1.0]), torch.ones(2, 2)]  # equal as numbers, not as bits
    assert compare_params(a, b) == {"identical": False, "max_difference": 0.0}
    c = [torch.tensor([0.0, 1.0]), torch.full((2, 2), 1.5)]
    assert compare_params(a, c) == {"identical": False, "max_difference": 0.5}


@pytest.mark.parametrize(
    "model, spec", [("resnet20", "resnet20"), ("vgg16", "vgg16:bn=false"), ("vgg16_bn", "vgg16")]
)
def test_shapes_are_the_zoo_models_the_trainer_builds(model, spec):
    built = build_model(spec, (3, 32, 32), 10)
    assert model_shapes(model) == [(n, tuple(p.shape)) for n, p in built.named_parameters()]
