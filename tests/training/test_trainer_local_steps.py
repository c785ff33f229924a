"""local_steps: H: the algorithm communicates once every H optimizer steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import topologies

from gossip_powersgd import LocalCluster
from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import TIMING_KEYS, gossips_after, train

from tests.conftest import run_mpi

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
STEPS = 13  # tiny.yaml: 1600 training samples / (4 peers x 32) -> 13 steps per epoch


def with_stats(comm, config, **kwargs):
    summary = train(comm, config, **kwargs)
    return summary, comm.stats.as_dict()


def local(config, **kwargs):
    return LocalCluster(topologies.parse(config.topology), timeout=30).run(
        with_stats, config, **kwargs
    )


def test_gossip_schedule():
    assert [s for s in range(12) if gossips_after(s, 4)] == [3, 7, 11]
    assert all(gossips_after(s, 1) for s in range(5))


@pytest.mark.parametrize(
    "algorithm",
    [
        "exact",
        "powergossip:rank=1",
        "choco:compressor=sign,gamma=0.2",
        "deepsqueeze:compressor=sign,gamma=0.2",
        "allreduce",
    ],
)
def test_traffic_counts_one_round_per_period(algorithm):
    base = load_config(TINY, deep=False).replace(
        epochs=1, quiet=True, log_every=1, algorithm=algorithm
    )
    every = local(base)
    periodic = local(base.replace(local_steps=4))
    rounds = STEPS // 4  # after steps 4, 8 and 12 of 13
    for (s1, c1), (s4, c4) in zip(every, periodic):
        # H = 4 sends what H = 1 sent in its first 3 rounds (PowerGossip's rounds alternate
        # between its two factors, so bytes per round are not constant; the log record of step 3
        # holds H = 1's bytes after 3 rounds)
        after_three = next(r for r in s1["history"] if r["kind"] == "log" and r["step"] == rounds)
        assert c4["bytes_sent"] == after_three["bytes_sent"]
        for key in ("messages_sent", "rounds") + (
            ("critical_bytes",) if "powergossip" not in algorithm else ()
        ):
            assert c4[key] * STEPS == c1[key] * rounds, key  # the same per round: exact scaling
        assert s4["communication_rounds"] == rounds and s4["local_steps"] == 4
        assert s4["exact_gossip_mb_per_peer_formula"] * STEPS == pytest.approx(
            s1["exact_gossip_mb_per_peer_formula"] * rounds, rel=1e-12
        )
        assert s4["steps"] == s1["steps"] == STEPS
    assert every[0][0]["model_sha256"] != periodic[0][0]["model_sha256"]


def test_local_steps_one_is_todays_behaviour():
    base = load_config(TINY, deep=False).replace(epochs=1, quiet=True)
    assert (
        local(base)[0][0]["model_sha256"]
        == local(base.replace(local_steps=1))[0][0]["model_sha256"]
    )


def test_gradient_averagers_refuse_local_steps():
    config = load_config(TINY, deep=False).replace(
        epochs=1, quiet=True, local_steps=2, algorithm="powersgd:rank=1"
    )
    with pytest.raises(ValueError, match="local_steps 2 needs an algorithm that mixes"):
        local(config)


class Interrupted(RuntimeError):
    pass


def comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def test_resume_mid_period_is_bit_exact(tmp_path):
    # 13 steps per epoch and H = 5: the epoch-1 checkpoint (step 13) falls 3 steps into a period
    config = load_config(TINY, deep=False).replace(
        epochs=3, quiet=True, local_steps=5, momentum=0.9, algorithm="powergossip:rank=1"
    )
    reference = local(config.replace(out_dir=str(tmp_path / "reference")))
    out = tmp_path / "run"

    def stop(step):
        if step == STEPS + 4:
            raise Interrupted

    with pytest.raises(Interrupted):
        local(config.replace(out_dir=str(out)), on_step=stop)
    assert ckpt.available_epochs(out, 0) == [1]
    resumed = local(config.replace(out_dir=str(out)), resume=True)
    for (a, ca), (b, cb) in zip(resumed, reference):
        assert a["model_sha256"] == b["model_sha256"]
        assert comparable(a["history"]) == comparable(b["history"])
        assert ca == cb  # traffic counters, rounds and critical bytes included


@pytest.mark.mpi
def test_mpi_matches_local(tmp_path):
    out = tmp_path / "mpi"
    args = [
        "--set",
        "local_steps=3",
        "--set",
        "epochs=2",
        "--set",
        "algorithm=choco:compressor=sign,gamma=0.2",
        "--quiet",
    ]
    result = run_mpi(
        4,
        [
            "-m",
            "gossip_powersgd.cli.train",
            "--config",
            TINY,
            "--set",
            "backend=mpi",
            "--set",
            f"out_dir={out}",
            *args,
        ],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    config = load_config(TINY, [a for a in args[:-1] if a != "--set"], deep=False).replace(
        quiet=True
    )
    summary = local(config)[0][0]
    assert json.loads((out / "summary.json").read_text())["model_sha256"] == summary["model_sha256"]
