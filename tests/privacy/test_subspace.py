"""dp_exchanged_subspace: DP-SGD's update kept where PowerGossip's next messages read it."""

import json
import subprocess
import sys

import pytest
import torch

import topologies
from gossip_powersgd.comm.local import LocalCluster
from gossip_powersgd.privacy.subspace import keep_exchanged_change_
from gossip_powersgd.training.hooks import TrainingHooks


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("k", [1, 3])
def test_the_kept_change_is_what_the_messages_read_and_nothing_else(side, k):
    """Right side: the message to a neighbour is M Q (Q = a row of the factors, transposed), so the
    kept change C must give C F^T = Delta F^T (the messages read the whole change) and C = C B B^T
    (nothing outside the span); left side the same with the change transposed. Float64: QR and
    the two products are backward stable, errors ~ n u |Delta| with n <= 12 and u = 2^-53; the
    bound 1e-12 |Delta| leaves a factor ~400 above that."""
    g = torch.Generator().manual_seed(k)
    batch, rows, cols = 2, 7, 12
    before = torch.randn(batch, rows, cols, generator=g, dtype=torch.float64)
    change = torch.randn(batch, rows, cols, generator=g, dtype=torch.float64)
    width = cols if side == "right" else rows
    factors = torch.randn(batch, k, width, generator=g, dtype=torch.float64)
    matrices = before + change
    keep_exchanged_change_(matrices, before, factors, side)
    kept = matrices - before
    if side == "left":
        kept, change = kept.transpose(1, 2), change.transpose(1, 2)
    bound = 1e-12 * change.abs().max()
    read = factors.transpose(1, 2)
    assert (kept @ read - change @ read).abs().max() <= bound
    basis = torch.linalg.qr(read).Q
    outside = kept - kept @ basis @ basis.transpose(1, 2)
    assert outside.abs().max() <= bound
    # and it is a real cut: the change had a part outside, now gone
    assert (change - change @ basis @ basis.transpose(1, 2)).abs().max() > 0.1


class _KeepModel(TrainingHooks):
    def setup(self, context):
        self.model = context.model


def _config(**changes):
    from gossip_powersgd.training.config import TrainConfig

    base = TrainConfig(
        topology="complete:2",
        dataset="synthetic_logreg:d=20,classes=4,n=2000",
        model="mlp:16",
        lr=0.5,
        momentum=0.9,
        batch_size=32,
        epochs=2,
        quiet=True,
        checkpoint_every=0,
        algorithm="powergossip:rank=1",
        partition="iid",
        dp_noise_multiplier=5.0,
        dp_max_grad_norm=1.0,
        dp_exchanged_subspace=True,
    )
    return base.replace(**changes)


def _train(comm, config):
    from gossip_powersgd.training.trainer import train

    keep = _KeepModel()
    summary = train(comm, config, hooks=[keep])
    return summary, torch.cat([p.detach().reshape(-1) for p in keep.model.parameters()])


@pytest.mark.parametrize("feedback", [False, True])
def test_one_edge_is_back_to_consensus_after_every_step_whatever_the_noise(feedback):
    """Two peers on one edge, gamma * W = 1/2, rank 1: the gossip removes the difference's part
    along the shared factor, and with the feature both peers' noisy updates lie in that part, so
    the models are equal again after every step (the exact part is averaged exactly). What is left
    is rounding: each step's float32 operations leave at most ~8 u |M|max per coordinate
    (u = 2^-24), and over T steps at most T times that. Without the feature the same noise leaves
    the models far apart (a consensus distance of hundreds). With feedback the update applied
    is larger (it carries what earlier steps cut off) but lies in the same subspace: the same."""
    cluster = LocalCluster(topologies.parse("complete:2"), timeout=120)
    (first, m0), (_, m1) = cluster.run(_train, _config(dp_subspace_feedback=feedback))
    steps = first["steps"]
    assert first["dp_exchanged_subspace"] is True
    bound = steps * 8 * 2.0**-24 * max(m0.abs().max(), m1.abs().max())
    assert (m0 - m1).abs().max() <= bound

    (whole, w0), (_, w1) = cluster.run(_train, _config(dp_exchanged_subspace=False))
    assert (w0 - w1).abs().max() > 1e4 * bound
    assert whole["final_consensus_distance"] > 1e6 * first["final_consensus_distance"]
    # the same accountant, the same steps: the epsilon is DP-SGD's either way
    assert whole["noise_multiplier"] == first["noise_multiplier"]


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(algorithm="exact"), "dp_exchanged_subspace works with algorithm powergossip"),
        (
            dict(dp_mechanism="zipdl", dp_zipdl_sigma=0.1),
            "dp_exchanged_subspace works with dp_mechanism: local",
        ),
        (
            dict(dp_noise_multiplier=None, dp_max_grad_norm=None),
            "dp_exchanged_subspace is set but differential privacy is off",
        ),
    ],
)
def test_bad_settings_are_one_line_errors(changes, words):
    from gossip_powersgd.training.features import features

    config = _config(**changes)
    with pytest.raises(ValueError, match=words) as error:
        for feature in features():
            feature.validate(config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(algorithm="powergossip:rank=1,warm=false"), "needs powergossip's warm start"),
        (dict(topology="one_peer_exponential:4"), "needs a static topology"),
    ],
)
def test_what_it_cannot_follow_is_refused_on_every_rank(changes, words):
    from gossip_powersgd.training.trainer import train

    config = _config(**changes)
    with pytest.raises(Exception, match=words):
        LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config)


def test_it_trains_through_the_cli_and_says_so_in_the_summary(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gossip_powersgd.cli.train",
            "--config",
            "experiments/configs/tiny.yaml",
            "--quiet",
            "--set",
            "epochs=1",
            "--set",
            f"out_dir={tmp_path}/run",
            "--set",
            "algorithm=powergossip:rank=1",
            "--set",
            "dp_noise_multiplier=0.5",
            "--set",
            "dp_max_grad_norm=1",
            "--set",
            "dp_exchanged_subspace=true",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dp_exchanged_subspace"] is True
    assert "kept in the subspace PowerGossip's next messages read" in (
        (tmp_path / "run" / "summary.md").read_text()
    )


def test_a_run_with_feedback_resumes_bit_for_bit(tmp_path):
    """The feedback's residual is state: a run resumed from a checkpoint must carry it on (with
    dp_secret: run_dir the noise resumes too), or its models would differ from the run's that
    never stopped."""
    import shutil

    from gossip_powersgd.training.checkpoint import read_checkpoint, save_checkpoint
    from gossip_powersgd.training.trainer import train

    config = _config(
        topology="ring:4",
        epochs=2,
        checkpoint_every=1,
        dp_secret="run_dir",
        dp_subspace_feedback=True,
    )

    def local(c, **kw):
        return LocalCluster(topologies.ring(4), timeout=120).run(train, c, **kw)

    reference = local(config.replace(out_dir=str(tmp_path / "a")))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for path in (tmp_path / "b" / "checkpoints").glob("rank-*-epoch-2.pt"):
        path.unlink()
    for name in ("summary.json", "summary.md"):
        (tmp_path / "b" / name).unlink()
    resumed = local(config.replace(out_dir=str(tmp_path / "b")), resume=True)
    assert resumed[0]["model_sha256"] == reference[0]["model_sha256"]
    # and the residual mattered: without it the resumed run lands elsewhere
    lost = tmp_path / "c"
    shutil.copytree(tmp_path / "b", lost, ignore=shutil.ignore_patterns("rank-*-epoch-2.pt"))
    for name in ("summary.json", "summary.md"):
        (lost / name).unlink()
    for path in (lost / "checkpoints").glob("rank-*-epoch-1.pt"):
        saved = read_checkpoint(path)
        assert saved["state"]["hooks"]["dp_exchanged_subspace"]["residual"]
        saved["state"]["hooks"]["dp_exchanged_subspace"] = {}
        save_checkpoint(lost, saved["header"], saved["state"])
    forgot = local(config.replace(out_dir=str(lost)), resume=True)
    assert forgot[0]["model_sha256"] != reference[0]["model_sha256"]
