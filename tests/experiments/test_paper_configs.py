"""The paper's grid (experiments/configs/paper/): every config builds its model and data pipeline
on tiny files in the real formats, and one trains through the CLI with --set for the data root."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gossip_powersgd.training.batches import Batches
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.data import clear_dataset_cache, load_dataset, peer_shard
from gossip_powersgd.training.evaluation import flat_logits
from gossip_powersgd.training.models import build_model

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "support"))
import paper_fixtures  # noqa: E402

from tests.conftest import ROOT, run_bounded  # noqa: E402

PAPER = ROOT / "experiments" / "configs" / "paper"
CONFIGS = sorted(PAPER.glob("*.yaml"))


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("paper-data")
    return {
        "cifar10": paper_fixtures.write_cifar10(base, per_batch=12),
        "wikitext2": paper_fixtures.write_wikitext2(base, repeat=40),
    }


def data_override(path: Path, roots) -> str:
    """The config's dataset spec with root= pointing at the fixture files."""
    spec = load_config(path, deep=False).dataset
    head, _, options = spec.partition(":")
    kept = [o for o in options.split(",") if o and not o.startswith("root=")]
    return f"dataset={','.join([f'{head}:root={roots[head]}', *kept])}"


def test_the_grid_is_complete():
    names = {p.stem for p in CONFIGS}
    assert {
        f"resnet20_cifar10_{a}"
        for a in (
            "allreduce",
            "exact",
            "powergossip_r1_i1_warm",
            "powergossip_r1_i2_warm",
            "powergossip_r1_i1_random",
            "powergossip_r1_i2_random",
            "choco_sign",
            "choco_topk1",
            "deepsqueeze",
        )
    } | {
        f"lstm_wikitext2_{a}"
        for a in (
            "exact",
            "powergossip_r1_i8",
            "powergossip_r1_i16",
            "powergossip_r1_i32",
            "local_steps32",
        )
    } == names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds_model_and_pipeline_on_fixture_files(path, roots):
    from gossip_powersgd.algorithms import make_algorithm  # noqa: F401 (the spec must parse)

    config = load_config(path, [data_override(path, roots)])  # deep: dataset, partition, model
    assert config.device == "auto" and config.topology in ("ring:8", "ring:16")
    peers = int(config.topology.split(":")[1])
    data = load_dataset(config.dataset, config.seed)
    x, y = peer_shard(data, peers - 1, peers, config.partition, config.seed)
    model = build_model(config.model, data.input_shape, data.num_classes, config.seed)
    batches = Batches(x, y, config.batch_size, seed=config.seed, rank=peers - 1)
    batches.transform = data.train_transform
    xb, yb = next(iter(batches))
    logits, targets = flat_logits(model(xb), yb)
    loss = torch.nn.functional.cross_entropy(logits, targets)
    assert torch.isfinite(loss) and logits.shape[-1] == data.num_classes
    if "lstm" in path.stem:
        assert yb.shape == xb.shape == (len(xb), 30)  # a target per token, BPTT 30
    else:
        assert xb.dtype == torch.float32 and xb.shape[1:] == (3, 32, 32)
    clear_dataset_cache()


def test_a_paper_config_trains_through_the_cli(tmp_path, roots):
    path = PAPER / "resnet20_cifar10_powergossip_r1_i1_warm.yaml"
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        str(path),
        "--set",
        data_override(path, roots),
        "--set",
        "backend=local",
        "--set",
        "epochs=1",
        "--set",
        "warmup_epochs=0",
        "--set",
        "schedule=constant",
        "--set",
        "milestones=[]",
        "--set",
        f"out_dir={out}",
        "--quiet",
    ]
    result = run_bounded(command, 300, "a paper config through the CLI", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["parameters"] == 272_474 and summary["peers"] == 8
    assert summary["mb_sent_per_peer"] > 0 and np.isfinite(summary["final_test_acc_avg_model"])
