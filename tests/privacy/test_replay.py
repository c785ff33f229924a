"""A run resumed under ``dp_secret: run_dir`` takes the steps since its checkpoint again with the
same noise: it may send them only if they are what it sent before, bit for bit (`releases`).

The run: ring of 4, 13 steps an epoch, killed after step 20, resumed from the epoch-1
checkpoint, so steps 13 to 19 are taken again."""

from __future__ import annotations

import math
import os
import re
import stat

import pytest
import torch

from gossip_powersgd.privacy.dpsgd import DPSGD
from gossip_powersgd.privacy.releases import digests_path
from gossip_powersgd.training import checkpoint as ckpt
from tests.privacy.test_training import (
    DP,
    Interrupted,
    _caller_rank,
    independent_epsilon,
    local,
    stop_at,
)

pytest.importorskip("opacus")

PEERS, PER_EPOCH, STOP, VICTIM = 4, 13, 20, 2
CONFIG = DP.replace(epochs=3, checkpoint_every=1, dp_secret="run_dir")
#: One float32 ulp at 1.0. Every coordinate of a release (clipped sum / B plus noise) is below 2
#: in size here (the clipped sum's norm is about C, the noise sigma C / B = 1/32 per coordinate),
#: where float32's spacing is at most this: the perturbation survives the rounding of the release,
#: as a gradient rounded otherwise (another device, thread count, torch build) may.
ULP = 2.0**-23


def releases_of(monkeypatch) -> dict:
    """(attempt, rank, noise label) -> the noisy gradients that step released (a copy)."""
    released, attempt = {}, {"n": 1}
    privatize = DPSGD.privatize

    def kept(self, model, batch_size):
        label = self.own_steps
        privatize(self, model, batch_size)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.cat([p.grad.detach().reshape(-1).double() for p in params])
        released[(attempt["n"], _caller_rank(), label)] = grads.clone()

    monkeypatch.setattr(DPSGD, "privatize", kept)
    return released, attempt


def killed_and_resumed(tmp_path, monkeypatch, perturb: bool):
    """The run killed after step STOP, then resumed; with `perturb`, the resumed VICTIM's clipped
    sums are one ulp off (another device or torch build would do the same to its rounding)."""
    released, attempt = releases_of(monkeypatch)
    config = CONFIG.replace(out_dir=str(tmp_path / "run"))
    with pytest.raises(Interrupted):
        local(config, on_step=stop_at(STOP))
    if perturb:
        clipped_sum = DPSGD.clipped_sum

        def off_by_one_ulp(self, model, batch_size, divisor=1.0):
            sums = clipped_sum(self, model, batch_size, divisor)
            if _caller_rank() == VICTIM:
                sums[0].reshape(-1)[0] += ULP
            return sums

        monkeypatch.setattr(DPSGD, "clipped_sum", off_by_one_ulp)
    attempt["n"] = 2
    return local(config, resume=True), released


def test_a_bit_exact_resume_under_run_dir_sends_the_same_bytes_and_adds_nothing(
    tmp_path, monkeypatch, capsys
):
    resumed, released = killed_and_resumed(tmp_path, monkeypatch, perturb=False)
    steps = resumed[0]["steps"]
    assert (resumed[0]["steps_per_epoch"], steps) == (PER_EPOCH, 3 * PER_EPOCH)
    for rank in range(PEERS):
        peer = resumed[rank]["peer"]
        assert peer["steps"] == steps and "steps_released_before_restart" not in peer
        expected = independent_epsilon(1.0, peer["sample_rate"], steps, peer["delta"])
        assert peer["epsilon"] == pytest.approx(expected, rel=1e-12)
        for label in range(PER_EPOCH, STOP):  # taken again: the very same bytes
            assert torch.equal(released[(1, rank, label)], released[(2, rank, label)])
        path = digests_path(tmp_path / "run", rank)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "taken again after the resume" not in capsys.readouterr().err


def switched_at(err: str) -> dict:
    """rank -> the step it said it switched to fresh noise at."""
    found = re.findall(r"dp \(rank (\d+)\): step (\d+), taken again after the resume", err)
    assert len(found) == len({rank for rank, _ in found})  # once per peer at most
    return {int(rank): int(step) for rank, step in found}


def test_a_replay_one_ulp_off_is_sent_as_fresh_noise_and_counted_as_dp_secret_os_counts_it(
    tmp_path, monkeypatch, capsys
):
    """Sent with the first attempt's noise, the victim's step 13 would hand its neighbours g1 + z
    and g2 + z: their difference g1 - g2, free of noise. It is sent as pure noise under a new
    key instead, and the 7 steps taken again are counted in its epsilon, as ``dp_secret: os``
    counts them (test_training.py). Its new message changes what the other peers compute from
    the next steps on: each of them sends again bit for bit until its own replay differs, then
    switches too, and counts the steps from there."""
    resumed, released = killed_and_resumed(tmp_path, monkeypatch, perturb=True)
    steps = resumed[0]["steps"]
    err = capsys.readouterr().err
    switched = switched_at(err)
    assert switched[VICTIM] == PER_EPOCH
    assert f"dp (rank {VICTIM}): step {PER_EPOCH}, taken again after the resume, differs" in err
    assert f"the {STOP - PER_EPOCH} private steps released from it on before are counted" in err
    # g2 + z would differ from g1 + z by about ULP. Fresh noise of std sigma C / B per coordinate
    # (B = batch size) differs from the old by sqrt(2) that, over 84 coordinates: a norm below
    # half of sigma C / B x sqrt(84) has probability far below 1e-20.
    scale = CONFIG.dp_noise_multiplier * CONFIG.dp_max_grad_norm / CONFIG.batch_size
    for rank in range(PEERS):
        peer = resumed[rank]["peer"]
        again = STOP - switched.get(rank, STOP)
        assert peer["steps"] == steps + again
        assert peer.get("steps_released_before_restart", 0) == again
        expected = independent_epsilon(1.0, peer["sample_rate"], steps + again, peer["delta"])
        assert peer["epsilon"] == pytest.approx(expected, rel=1e-12)
        assert resumed[rank]["history"][-1]["epsilon"] == peer["epsilon"]
        for label in range(PER_EPOCH, STOP - again):  # before its switch: the same bytes
            assert torch.equal(released[(1, rank, label)], released[(2, rank, label)])
        if again:
            first, second = released[(1, rank, STOP - again)], released[(2, rank, STOP - again)]
            assert (second - first).norm() > 0.5 * scale * math.sqrt(first.numel())


def test_a_peers_away_file_leaves_the_digests_its_older_checkpoint_needs(tmp_path, capsys):
    """Churn: peer 1 leaves at step 17 and is back at 20. Its away file counted as a checkpoint
    and pruned its digests to those from step 17, while its epoch-1 checkpoint (step 13) was
    still one of its two kept: resumed from epoch 1 (rank 2 killed before writing epoch 2), its
    step 13 had no digest, went out as pure noise under a new key, and the other peers' replays
    differed in turn. Now every step is sent again bit for bit and nothing is added."""
    from tests.training.test_churn import Interrupted as Stopped
    from tests.training.test_churn import config_for, run

    dp = dict(momentum=0.0, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_secret="run_dir")
    config = config_for(tmp_path / "run", churn="leave:1@17,join:1@20", epochs=3, **dp)
    with pytest.raises(Stopped):
        run(config, stop_at=2 * PER_EPOCH + 4)  # after the epoch-2 checkpoint
    ckpt.checkpoint_path(tmp_path / "run", 2, 2).unlink()  # rank 2 killed before writing it
    resumed = run(config, resume=True)  # from epoch 1: steps 13 to 29 are taken again
    assert "taken again after the resume" not in capsys.readouterr().err
    for rank in range(PEERS):  # the steps each trained, peer 1 away for 3: none counted twice
        peer = resumed[rank]["peer"]
        assert peer["steps"] == 3 * PER_EPOCH - (3 if rank == 1 else 0)
        assert "steps_released_before_restart" not in peer
