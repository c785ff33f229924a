"""The trainer: convergence, the D-PSGD step order, accounting, and the CLI end to end (MPI too)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.algorithms import REGISTRY, register
from gossip_powersgd.algorithms.base import GossipAlgorithm
from gossip_powersgd.comm.base import nbytes
from gossip_powersgd.training import setup as training_setup
from gossip_powersgd.training.config import TrainConfig, load_config
from gossip_powersgd.training.hooks import TrainingHooks
from gossip_powersgd.training.trainer import TIMING_KEYS, train
from tests.conftest import (
    TINY,
    run_mpi,
)

ROOT = Path(__file__).resolve().parents[2]


def local(config: TrainConfig, **kwargs):
    return LocalCluster(topologies.parse(config.topology), timeout=30).run(train, config, **kwargs)


def comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


# ---- convergence -------------------------------------------------------------------------------

CONVERGENCE = TrainConfig(
    topology="ring:8",
    dataset="synthetic_logreg:d=20,classes=4,n=4000",
    model="logreg",
    optimizer="sgd",
    lr=0.5,
    batch_size=32,
    epochs=6,
    eval_every=2,
    quiet=True,
    checkpoint_every=0,
)


@pytest.mark.parametrize("algorithm", ["powergossip:rank=1", "exact", "powersgd:rank=1"])
def test_logistic_regression_converges_on_8_peers(algorithm):
    summaries = local(CONVERGENCE.replace(algorithm=algorithm))
    s = summaries[0]
    assert s["steps"] == 6 * 13
    # the teacher is linear with small logit noise: a good fit has a low loss and a high accuracy
    assert s["final_train_loss"] < 0.45, s
    assert s["final_test_acc_avg_model"] > 0.9, s
    assert s["final_test_acc_local_min"] > 0.85, s
    assert s["final_consensus_distance"] < 0.5
    # every peer returns the same summary (only its rank, history and own figures differ)
    for other in summaries[1:]:
        assert {k: v for k, v in other.items() if k not in ("rank", "history", "peer")} == {
            k: v for k, v in s.items() if k not in ("rank", "history", "peer")
        }


def test_accounting_exact_gossip_matches_the_formula():
    s = local(CONVERGENCE.replace(algorithm="exact", epochs=1))[0]
    # exact gossip sends the model to each neighbour every step: the formula is what it sends
    assert s["compression_ratio"] == pytest.approx(1.0)
    assert s["mb_sent_per_peer"] == pytest.approx(s["exact_gossip_mb_per_peer_formula"])
    assert s["messages_sent_per_peer"] == 2 * s["steps"]
    p = local(CONVERGENCE.replace(algorithm="powergossip:rank=1", epochs=1))[0]
    assert p["compression_ratio"] > 2
    assert len(p["label_histogram"]) == 8 and sum(map(sum, p["label_histogram"])) == 3200


# ---- the step order ----------------------------------------------------------------------------


class _Probe(GossipAlgorithm):
    """Records, at each step(), whether the gradients exist and whether the optimizer has stepped."""

    name = "probe"
    log = []

    def __init__(self, params, comm, mode="parameters"):
        super().__init__(params, comm)
        self.acts_on = mode
        self.before = [p.detach().clone() for p in self.params]

    def _step(self):
        moved = any(not torch.equal(p, b) for p, b in zip(self.params, self.before))
        grads = all(p.grad is not None for p in self.params)
        _Probe.log.append((self.comm.rank, self.acts_on, grads, moved))
        if self.acts_on == "gradients":
            for p in self.params:
                p.grad.zero_()  # the optimizer must see what the averager left
        self.before = [p.detach().clone() for p in self.params]

    def bytes_per_step(self):
        return 0


@pytest.fixture
def probe():
    register("probe", _Probe, {"mode": ("mode", str)}, "test probe")
    _Probe.log = []
    yield _Probe
    REGISTRY.pop("probe")


def test_dpsgd_order_parameters_after_optimizer_step(probe):
    local(
        CONVERGENCE.replace(algorithm="probe:mode=parameters", topology="ring:4", epochs=1, lr=0.1)
    )
    assert probe.log and all(grads and moved for _, _, grads, moved in probe.log)


def test_gradient_averagers_act_between_backward_and_optimizer_step(probe):
    summaries = local(
        CONVERGENCE.replace(algorithm="probe:mode=gradients", topology="ring:4", epochs=1, lr=0.1)
    )
    # gradients present, parameters not yet moved at each call; since the probe zeroes the
    # gradients, the optimizer never moves anything: the model stays at its initial value.
    assert probe.log and all(grads and not moved for _, _, grads, moved in probe.log)
    assert summaries[0]["final_consensus_distance"] == 0.0


def test_train_without_out_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    summaries = local(load_config(TINY, deep=False).replace(epochs=1, quiet=True))
    assert summaries[0]["run_dir"] is None and list(tmp_path.iterdir()) == []
    assert len({s["model_sha256"][s["rank"]] for s in summaries}) == 4  # peers differ
    assert all(s["model_sha256"] == summaries[0]["model_sha256"] for s in summaries)


def test_uneven_shards_keep_peers_in_lockstep():
    config = CONVERGENCE.replace(
        topology="ring:4", partition="dirichlet:0.3", epochs=2, algorithm="powergossip:rank=1"
    )
    s = local(config)[0]
    sizes = [sum(row) for row in s["label_histogram"]]
    assert len(set(sizes)) > 1 and s["steps"] == 2 * s["steps_per_epoch"]


# ---- the CLI, under MPI and in one process -----------------------------------------------------


@pytest.fixture(scope="module")
def mpi_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi") / "run"
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
            f"out_dir={out}",
            "--quiet",
        ],
        timeout=100,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


@pytest.mark.mpi
def test_mpi_end_to_end_run_directory(mpi_run, tmp_path):
    out, result = mpi_run
    assert "averaged-model test accuracy" in result.stdout
    assert result.stdout.count("averaged-model test accuracy") == 1  # rank 0 only
    config = load_config(out / "config.yaml", deep=False)
    assert config.backend == "mpi" and config.peers == 4 and config.out_dir == str(out)
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "final_test_acc_avg_model",
        "final_test_acc_local_mean",
        "final_test_acc_local_min",
        "final_test_acc_local_max",
        "final_consensus_distance",
        "mb_sent_per_peer",
        "exact_gossip_mb_per_peer_formula",
        "compression_ratio",
        "wall_time_s",
        "label_histogram",
    ):
        assert summary[key] is not None, key
    assert summary["final_test_acc_avg_model"] > 0.8
    assert "formula" in summary["exact_gossip_formula"]
    assert "| averaged-model test accuracy |" in (out / "summary.md").read_text()
    for rank in range(4):
        records = [
            json.loads(line)
            for line in (out / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
        ]
        evals = [r for r in records if r["kind"] == "eval"]
        assert [r["epoch"] for r in evals] == [1, 2, 3]
        assert any(r["kind"] == "log" for r in records)
        assert all(r["bytes_sent"] > 0 for r in evals)
        assert (out / "checkpoints" / f"rank-{rank}-epoch-3.pt").exists()

    from experiments.plot import FIGURES
    from experiments.plot import run as plot

    written = plot([str(out), str(out), "--out", str(tmp_path / "plots")])
    assert sorted(p.name for p in written) == sorted(FIGURES)
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.mpi
def test_mpi_and_local_backends_agree_bit_for_bit(mpi_run, tmp_path):
    out, _ = mpi_run
    from experiments.train import run

    local_out = tmp_path / "local"
    summary = run(["--config", str(TINY), "--set", f"out_dir={local_out}", "--quiet"])
    mpi_summary = json.loads((out / "summary.json").read_text())
    assert summary["model_sha256"] == mpi_summary["model_sha256"]
    for rank in range(4):
        a = [
            json.loads(x) for x in (out / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
        ]
        b = [
            json.loads(x)
            for x in (local_out / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
        ]
        assert comparable(a) == comparable(b)


@pytest.mark.mpi
def test_existing_run_dir_is_never_overwritten(mpi_run):
    out, _ = mpi_run
    before = (out / "summary.json").read_text()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.train",
            "--config",
            str(TINY),
            "--set",
            f"out_dir={out}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: run directory {out} already exists")
    assert "--resume" in lines[0]
    assert (out / "summary.json").read_text() == before


def test_cli_errors_in_process(tmp_path):
    from experiments.train import run

    with pytest.raises(
        ValueError, match="backend mpi runs one peer per MPI rank: launch with mpiexec -n 4"
    ):
        run(["--config", str(TINY), "--set", "backend=mpi", "--set", f"out_dir={tmp_path / 'x'}"])
    with pytest.raises(ValueError, match="give --config"):
        run([])
    with pytest.raises(ValueError, match="has no config.yaml"):
        run(["--resume", str(tmp_path)])
    with pytest.raises(ValueError, match="bad value for 'model'"):
        run(["--config", str(TINY), "--set", "model=transformer"])


@pytest.mark.mpi
def test_cli_resume_of_an_mpi_run_in_one_process(mpi_run, tmp_path):
    """--resume RUN_DIR uses the run's config.yaml; a checkpoint written under MPI resumes locally."""
    import shutil

    from experiments.train import run

    out, _ = mpi_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for rank in range(4):
        (copy / "checkpoints" / f"rank-{rank}-epoch-3.pt").unlink()
    (copy / "summary.json").unlink()
    with pytest.raises(ValueError, match=r"another config: lr 0\.5 -> 0\.25"):
        run(["--resume", str(copy), "--set", "backend=local", "--set", "lr=0.25"])
    summary = run(["--resume", str(copy), "--set", "backend=local", "--quiet"])
    assert summary["model_sha256"] == json.loads((out / "summary.json").read_text())["model_sha256"]
    assert load_config(copy / "config.yaml", deep=False).backend == "local"
    for rank in range(4):
        a = (out / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
        b = (copy / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
        assert comparable(map(json.loads, a)) == comparable(map(json.loads, b))


@pytest.mark.mpi
def test_every_run_records_its_provenance(mpi_run, tmp_path):
    out, _ = mpi_run
    origin = json.loads((out / "summary.json").read_text())["provenance"]
    import socket

    import gossip_powersgd
    from gossip_powersgd.training.provenance import source_checkout

    assert origin["gossip_powersgd"] == gossip_powersgd.__version__
    assert origin["libraries"]["torch"] == torch.__version__
    assert origin["libraries"]["mpi4py"] is not None
    assert (origin["backend"], origin["world_size"]) == ("mpi", 4)
    assert origin["peers_per_host"] == {socket.gethostname()[:64]: 4}
    assert "--config" in origin["command"] and str(TINY) in origin["command"]
    # the launcher's command line, as typed (found among the rank's ancestors), not train.py's
    assert origin["launcher"] == "mpiexec" and Path(origin["command"][0]).name == "mpiexec"
    assert origin["command"][1:3] == ["-n", "4"] and "experiments.train" in origin["command"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30
    ).stdout.strip()
    assert origin["git_commit"] == head and isinstance(origin["git_dirty"], bool)
    # config.yaml opens with the same facts as comments and still reads as the run's config
    text = (out / "config.yaml").read_text()
    assert text.startswith(f"# gossip_powersgd {gossip_powersgd.__version__}, commit {head}")
    assert load_config(out / "config.yaml").backend == "mpi"
    # a folder that is no checkout of this package (an installed wheel) records no commit
    assert source_checkout(tmp_path) == {"git_commit": None, "git_dirty": None}


# ---- Reliability IV: gradient clipping for plain training --------------------------------------


class _GradNorms(TrainingHooks):
    """Each peer's global gradient norm as the optimizer used it (read after its step)."""

    name = "grad_norms"

    def __init__(self):
        self.seen, self.params = {}, {}  # by peer thread (one instance serves every peer)

    def setup(self, context):
        self.params[threading.get_ident()] = list(context.model.parameters())

    def after_optimizer_step(self, step):
        params = self.params[threading.get_ident()]
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        self.seen.setdefault(threading.get_ident(), []).append(float(norm))


@pytest.mark.parametrize("algorithm", ["exact", "powersgd:rank=1"])
def test_max_grad_norm_clips_the_gradient_the_optimizer_steps_with(algorithm):
    """max_grad_norm: c scales each step's gradient (after a gradient averager's all-reduce) to a
    global norm of at most c, as torch.nn.utils.clip_grad_norm_ does; without it the same run's
    gradients exceed c (so the bound is the clipping's doing)."""
    config = CONVERGENCE.replace(algorithm=algorithm, topology="ring:4", epochs=1, lr=0.5)
    free, clipped = _GradNorms(), _GradNorms()
    local(config, hooks=[free])
    local(config.replace(max_grad_norm=0.05), hooks=[clipped])
    assert max(max(v) for v in free.seen.values()) > 0.5
    # clip_grad_norm_ scales by c / (norm + 1e-6): float32 rounding of the sum of squares
    assert all(n <= 0.05 * (1 + 1e-5) for v in clipped.seen.values() for n in v)
    assert max(max(v) for v in clipped.seen.values()) > 0.049


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(max_grad_norm=0.0), "bad value for 'max_grad_norm': 0.0 (must be > 0 and finite"),
        (dict(max_grad_norm=float("inf")), "bad value for 'max_grad_norm': inf"),
        (
            dict(max_grad_norm=1.0, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0),
            "max_grad_norm clips plain training's gradient; under DP each sample's gradient is "
            "clipped by dp_max_grad_norm",
        ),
    ],
)
def test_max_grad_norm_bad_values_are_one_line_errors(changes, words):
    from gossip_powersgd.training.config import validate_config

    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate_config(CONVERGENCE.replace(**changes), deep=False)


@pytest.mark.parametrize("algorithm", ["powergossip:rank=1", "exact"])
def test_a_peer_sends_exactly_the_algorithms_bytes(monkeypatch, algorithm):
    """During training, what goes through the point-to-point transport equals the algorithm's
    bytes_per_step() summed over its steps; the other traffic is metric all-reduces no larger than
    the model and short control messages, so no training data ever leaves a peer."""
    config = load_config(TINY, [f"algorithm={algorithm}", "epochs=2", "quiet=true"], deep=False)
    predicted, traffic = {}, {}
    real_make = training_setup.make_algorithm

    def make_algorithm(spec, params, comm):
        algorithm = real_make(spec, params, comm)
        real_step = algorithm.step

        def step():
            predicted[comm.rank] += algorithm.bytes_per_step()
            real_step()

        algorithm.step = step
        return algorithm

    monkeypatch.setattr(training_setup, "make_algorithm", make_algorithm)

    def peer(comm):
        predicted[comm.rank] = 0
        seen = traffic[comm.rank] = {
            "exchange": 0,
            "training_allreduce": 0,
            "metric_numel": [],
            "control_bytes": [],
        }
        real_exchange, real_allreduce, real_gather = (
            comm.exchange,
            comm.allreduce_,
            comm.allgather_bytes,
        )

        def exchange(send, recv):
            seen["exchange"] += sum(nbytes(t) for t in send.values())
            real_exchange(send, recv)

        def allreduce_(tensor, op="mean", metric=False):
            if metric:
                seen["metric_numel"].append(tensor.numel())
            else:
                seen["training_allreduce"] += nbytes(tensor)
            return real_allreduce(tensor, op, metric)

        def allgather_bytes(data):
            seen["control_bytes"].append(len(data))
            return real_gather(data)

        comm.exchange, comm.allreduce_, comm.allgather_bytes = exchange, allreduce_, allgather_bytes
        summary = train(comm, config)
        return summary, comm.stats.bytes_sent

    results = LocalCluster(topologies.parse(config.topology), timeout=30).run(peer)
    for rank, (summary, bytes_sent) in enumerate(results):
        seen = traffic[rank]
        assert seen["exchange"] == predicted[rank] == bytes_sent > 0
        assert seen["training_allreduce"] == 0
        assert max(seen["metric_numel"]) <= summary["parameters"]  # 84; a data shard is 10,000
        assert max(seen["control_bytes"]) <= 64
        assert summary["steps"] == 2 * summary["steps_per_epoch"]
