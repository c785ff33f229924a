"""gossip_powersgd.run(config) -> RunResult: a dict, a TrainConfig or a YAML path, validated as
gossip-train validates it; every peer in-process (backend local) or, under mpiexec, this rank; the
result's counters, evaluations and final states hold what the run did."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

import gossip_powersgd
from gossip_powersgd import RunResult, run
from gossip_powersgd.cli import train as gossip_train
from gossip_powersgd.training.config import config_from_dict
from gossip_powersgd.training.hooks import TrainingHooks

from tests.conftest import run_mpi

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(
    topology="ring:4",
    algorithm="powergossip:rank=1",
    dataset="synthetic_logreg:d=20,classes=4,n=2000",
    partition="iid",
    model="logreg",
    lr=0.5,
    epochs=2,
    eval_every=1,
    log_every=5,
    seed=0,
    backend="local",
    quiet=True,
)


def test_run_is_exported_with_its_result_type():
    assert gossip_powersgd.run is run and "run" in gossip_powersgd.__all__
    assert "RunResult" in gossip_powersgd.__all__


def test_a_dict_runs_every_peer_in_process_and_the_result_holds_the_counters():
    seen = []
    result = run(TINY, hooks=lambda rank: seen.append(rank) or [])
    assert isinstance(result, RunResult) and sorted(seen) == [0, 1, 2, 3]
    assert sorted(result.stats) == [0, 1, 2, 3] and result.run_dir is None
    # the summary's MB per peer is the mean of the peers' own training counters
    mean = sum(result.bytes_sent.values()) / 4
    assert result.mb_sent_per_peer == pytest.approx(mean / 1e6, rel=1e-12)
    assert all(result.metric_bytes_sent[r] > 0 for r in range(4))  # counted apart
    assert [r["epoch"] for r in result.evals] == [1, 2]
    assert result.acc_avg == result.evals[-1]["test_acc_avg_model"] > 0.8
    assert result.acc_local_min <= result.acc_local_mean <= result.acc_local_max
    assert result.consensus_distance == result.evals[-1]["consensus_distance"] > 0
    assert any(r["kind"] == "log" for r in result.history) and result.steps == 2 * 13
    assert 0 < result.compute_seconds and result.train_seconds <= result.wall_seconds
    assert sorted(result.peers) == [0, 1, 2, 3] and result.states is None


def test_states_are_every_peers_final_model():
    result = run(dict(TINY, algorithm="allreduce"), states=True)
    # all-reduce averages the gradients: every peer ends with the same model, bit for bit
    first = result.states[0]
    assert sorted(first) == ["1.bias", "1.weight"]
    for rank in range(1, 4):
        assert all(torch.equal(first[k], result.states[rank][k]) for k in first)
    local = run(TINY, states=True).states
    assert not torch.equal(local[0]["1.weight"], local[1]["1.weight"])  # gossip: not equal


class _Stop(TrainingHooks):
    """Ends the run at `step` (after the epoch-1 checkpoint); watches only, so not resumed."""

    name, optional = "stop", True

    def __init__(self, step: int):
        self.step = step

    def after_step(self, step, loss):
        if step == self.step:
            raise RuntimeError(f"stopped at step {step}")


@pytest.mark.parametrize("first, then", [(False, True), (True, False)])
def test_a_run_resumes_with_or_without_states(tmp_path, first, then):
    """run()'s own hook for `states` was in the checkpoint's hooks, so a resume that asked for
    states when the first call had not (or the other way) was refused naming a hook the user
    never gave. The resumed run ends with the uninterrupted run's models, bit for bit."""
    config = dict(TINY, out_dir=str(tmp_path / "run"), checkpoint_every=1)
    with pytest.raises(Exception, match="stopped at step 16"):  # epoch 1 is steps 0-12
        run(config, hooks=lambda rank: [_Stop(16)], states=first)
    resumed = run(config, resume=True, states=then)
    reference = run(dict(config, out_dir=str(tmp_path / "reference")), states=True)
    assert resumed.summary["model_sha256"] == reference.summary["model_sha256"]
    if then:
        for rank in range(4):
            assert all(
                torch.equal(v, reference.states[rank][k]) for k, v in resumed.states[rank].items()
            )


def test_a_yaml_path_writes_its_run_directory_as_gossip_train_does(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(dict(TINY, out_dir=str(tmp_path / "run"))))
    result = run(path)
    assert result.run_dir == tmp_path / "run"
    written = json.loads((result.run_dir / "summary.json").read_text())
    assert written == json.loads(json.dumps(result.summary))
    lines = (result.run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(result.history))


def test_a_used_out_dir_names_the_python_way_to_resume_beside_the_cli_flags(tmp_path):
    """The message is gossip-train's and run()'s alike; it named only --set and --resume, flags
    a Python caller does not have."""
    used = tmp_path / "run"
    used.mkdir()
    (used / "summary.json").write_text("{}")
    with pytest.raises(ValueError) as refused:
        run(dict(TINY, out_dir=str(used)))
    assert str(refused.value) == (
        f"run directory {used} already exists; choose another out_dir (--set out_dir=...) or "
        f"continue it with --resume {used} (from Python: run(..., resume=True))"
    )


@pytest.mark.parametrize(
    "bad", [dict(dataset="nosuch"), dict(model="mlp:0"), dict(lr=-1.0), dict(algorithm="nope")]
)
def test_a_bad_config_is_refused_with_gossip_trains_message(tmp_path, bad):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(dict(TINY, **bad)))
    with pytest.raises(ValueError) as cli:
        gossip_train.run(["--config", str(path), "--quiet"])
    for config in (dict(TINY, **bad), path, config_from_dict(dict(TINY, **bad))):
        with pytest.raises(ValueError) as library:
            run(config)
        assert str(library.value) == str(cli.value)


def test_under_churn_the_summary_is_a_member_at_the_end_even_when_peer_0_has_left():
    # peer 0 leaves at step 5 and never returns: its own summary has no final figures
    result = run(dict(TINY, algorithm="exact", on_peer_loss="continue", churn="leave:0@5"))
    assert result.acc_avg is not None and result.acc_avg > 0.8
    assert result.summary["members_at_end"] == [1, 2, 3]
    assert result.evals[-1]["epoch"] == 2


def test_a_launched_backend_without_its_launcher_is_refused():
    with pytest.raises(ValueError, match=r"launch with mpiexec -n 4 python -m \.\.\."):
        run(dict(TINY, backend="mpi"))
    with pytest.raises(ValueError, match="give a dict, a TrainConfig or a YAML path"):
        run(42)


# Each rank writes its own file: mpiexec forwards the ranks' stdout in chunks that may interleave
# within a line, so one JSON line per rank on a shared stdout is not guaranteed to stay whole.
SCRIPT = """
import json, os, sys
from gossip_powersgd import run
config = json.loads(sys.argv[1])
result = run(config)
rank = sorted(result.stats)[0]
path = os.path.join(sys.argv[2], f"rank-{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"ranks": sorted(result.stats), "acc": result.acc_avg,
               "sha": result.summary["model_sha256"]}, f)
os.replace(path + ".tmp", path)
"""


@pytest.mark.mpi
def test_under_mpiexec_each_process_runs_its_rank_with_the_local_results(tmp_path):
    config = json.dumps(dict(TINY, backend="mpi"))
    done = run_mpi(4, ["-c", SCRIPT, config, str(tmp_path)], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    assert len(lines) == 4, sorted(p.name for p in tmp_path.iterdir())
    assert sorted(r["ranks"][0] for r in lines) == [0, 1, 2, 3]  # each its own rank only
    assert all(len(r["ranks"]) == 1 for r in lines)
    local = run(TINY)
    assert {r["acc"] for r in lines} == {local.acc_avg}
    assert all(r["sha"] == local.summary["model_sha256"] for r in lines)  # MPI ≡ local


def test_the_runner_module_imports_no_torch_until_run_is_called():
    """The module alone (its package's __init__ imports torch today; `run` must not add to that
    when the package stops doing so)."""
    import subprocess

    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('alone', 'gossip_powersgd/runner.py')\n"
        "module = sys.modules['alone'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_threads_beyond_the_cpus_are_clamped_as_gossip_train_clamps_them(monkeypatch):
    """run() gave `threads` to torch as it was: 100000 (a valid config value) crashed the caller's
    process (torch cannot start the threads; a segfault here). It is clamped to the CPUs this
    process may use with gossip-train's warning. torch is asked through a stand-in that refuses
    more than the CPUs, so the old code fails here instead of crashing the test run."""
    import os

    from gossip_powersgd.utils import RunWarning

    cpus, real, asked = len(os.sched_getaffinity(0)), torch.set_num_threads, []

    def set_num_threads(n):
        asked.append(n)
        assert n <= cpus, f"torch asked for {n} threads on {cpus} CPUs"
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", set_num_threads)
    try:
        with pytest.warns(RunWarning, match=f"threads 100000 exceeds the {cpus} CPUs"):
            result = run(dict(TINY, threads=100000, epochs=1))
    finally:
        real(1)
    assert cpus in asked and result.config.threads == 100000 and result.acc_avg > 0.8


def test_run_leaves_the_callers_torch_thread_count_as_it_was_also_on_an_error():
    """Before: `run()` left torch's intra-op thread count at the config's `threads` (1) in the
    caller's process after it returned."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        run(TINY)
        assert torch.get_num_threads() == 2

        def broken(rank):
            raise RuntimeError("hooks of a test that fail")

        with pytest.raises(Exception, match="hooks of a test that fail"):
            run(TINY, hooks=broken)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
