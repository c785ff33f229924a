"""DP guarantees against a curious neighbour: secret per-peer randomness, and no side releases.

The neighbour knows the whole config (the seed too), the code, the common initial model, its own
state and every byte it receives; it does not know the victim's data or its key.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat

import pytest
import torch
from torch.nn import functional as F

import topologies
from mechanism_fixtures import small_config
from gossip_powersgd import LocalCluster
from gossip_powersgd.comm.local import LocalCommunicator
from gossip_powersgd.privacy import load_view
from gossip_powersgd.privacy.seeds import NOISE_STREAM, SAMPLER_STREAM, derive_seed
from gossip_powersgd.training.config import TrainConfig
from gossip_powersgd.training.data import load_dataset, peer_shard
from gossip_powersgd.training.models import build_model
from gossip_powersgd.training.trainer import TIMING_KEYS, train

pytest.importorskip("opacus")

VICTIM, OBSERVER = 1, 0
CONFIG = small_config(dp_noise_multiplier=1.0)


def local(config: TrainConfig, **kwargs):
    return LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config, **kwargs)


# ---- the neighbour as attacker -------------------------------------------------------------------


def initial_model(config):
    """The common initial model: built from the config, as every peer builds it."""
    dataset = load_dataset(config.dataset, config.seed)
    return build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)


def noisy_sum_from_first_message(config, message):
    """What the neighbour computes from the victim's first message (exact gossip sends the
    parameters right after the local SGD step theta_1 = theta_0 - lr (S + noise) / B): S + noise,
    with B = batch_size, the expected batch the sum is divided by."""
    theta0 = torch.cat([p.detach().reshape(-1) for p in initial_model(config).parameters()])
    return (theta0.double() - message.double()) * config.batch_size / config.lr


def regenerated_noises(config, shapes):
    """The neighbour's attempts at the victim's step-0 noise from what it knows: today's seeding
    of the noise generator by (seed, rank), and the public-randomness key of (seed, rank)."""
    from gossip_powersgd.privacy.seeds import Randomness

    std = config.dp_noise_multiplier * config.dp_max_grad_norm
    generator = torch.Generator().manual_seed(derive_seed(config.seed, VICTIM, NOISE_STREAM))
    seeded = torch.cat(
        [torch.normal(0.0, std, size=s, generator=generator).reshape(-1) for s in shapes]
    ).double()
    public = Randomness.public(config.seed, VICTIM)
    keyed = std * public.normals(NOISE_STREAM, 0, 0, n=sum(math.prod(s) for s in shapes))
    return {"seeded by (seed, rank)": seeded, "public key of (seed, rank)": keyed}


def regenerated_masks(config, shard_size, rate):
    """The neighbour's attempts at the victim's step-0 Poisson mask (given the true rate)."""
    from gossip_powersgd.privacy.seeds import Randomness

    generator = torch.Generator().manual_seed(
        derive_seed(config.seed, VICTIM, SAMPLER_STREAM, 0, 0)
    )
    seeded = torch.rand(shard_size, generator=generator) < rate
    public = Randomness.public(config.seed, VICTIM).uniforms(SAMPLER_STREAM, 0, 0, n=shard_size)
    return {"seeded by (seed, rank)": seeded, "public key of (seed, rank)": public < rate}


def clipped_sum(config, x, y):
    """The referee's S: the victim's per-example gradients (torch.func, not Opacus) clipped to C
    (norm over all parameters, + 1e-6 as the engine does) and summed."""
    model = initial_model(config)
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p, xi, yi):
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([grads[name].reshape(len(y), -1) for name in params], dim=1).double()
    factor = (config.dp_max_grad_norm / (flat.norm(dim=1) + 1e-6)).clamp(max=1.0)
    return (factor[:, None] * flat).sum(dim=0)


def test_a_neighbour_cannot_regenerate_the_victims_noise_or_masks(tmp_path):
    """The neighbour regenerates the victim's noise and Poisson mask of step 0 in every way the
    public information allows, subtracts the noise from the victim's first message and compares
    with the truth. The noise is 1.0 x C per coordinate on 84 coordinates (norm about 9 C), the
    clipped sum at most 32 C.

    Checked by hand on the code before secret keys (main at d6e8915, whose privacy code is this
    branch's base c9f5207; the attempts "seeded by (seed, rank)" are exactly what it drew): the
    same attack, same config, recovered the victim's clipped sum to a relative error of 2.7e-7
    though the noise was 1.4x larger than it, and its mask is the one that code drew, so this
    test fails there. Here the error is the size of the noise and the guessed masks overlap the
    true one no more than independent draws do.
    """
    run_dir = tmp_path / "run"
    config = CONFIG.replace(out_dir=str(run_dir), observers=[OBSERVER], dp_secret="run_dir")
    local(config)
    message = load_view(run_dir / "observed" / f"rank-{OBSERVER}").messages_from(VICTIM)[0]
    assert message["step"] == 0
    noisy = noisy_sum_from_first_message(config, message["tensor"])

    # The referee, who holds the victim's data and its key file, computes the truth.
    from gossip_powersgd.privacy.seeds import Randomness

    key = Randomness.run_dir_key(run_dir, VICTIM)
    dataset = load_dataset(config.dataset, config.seed)
    x, y = peer_shard(dataset, VICTIM, 4, config.partition, config.seed)
    rate = config.batch_size / len(y)
    mask = key.uniforms(SAMPLER_STREAM, 0, 0, n=len(y)) < rate
    truth = clipped_sum(config, x[mask], y[mask])
    shapes = [tuple(p.shape) for p in initial_model(config).parameters()]
    std = config.dp_noise_multiplier * config.dp_max_grad_norm
    true_noise = std * key.normals(NOISE_STREAM, 0, 0, n=sum(math.prod(s) for s in shapes))
    noise_norm = std * math.sqrt(noisy.numel())
    # With the key the subtraction is exact up to float32 rounding of the parameters (|theta| ~ 1,
    # times B / lr = 64: about 1e-5 per coordinate), which validates the referee's truth.
    assert (noisy - true_noise - truth).norm() < 1e-3 * noise_norm

    for how, guess in regenerated_noises(config, shapes).items():
        error = (noisy - guess - truth).norm()
        # Independent of the true noise, the error is the difference of two N(0, std^2 I): its
        # norm is about sqrt(2) x noise_norm; below half of noise_norm has probability < 1e-20.
        assert error > 0.5 * noise_norm, how
    expected = len(y) * rate**2  # |guess & truth| of independent masks: Binomial(n, q^2)
    for how, guess in regenerated_masks(config, len(y), rate).items():
        overlap = int((guess & mask).sum())
        # mean n q^2 = 2 here; 10 is > 5 standard deviations above it
        assert overlap <= expected + 5 * math.sqrt(expected) + 1, (how, overlap, int(mask.sum()))


# ---- where the secret lives ----------------------------------------------------------------------


def comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def test_run_dir_key_resumes_bit_for_bit_and_stays_in_its_peers_files(tmp_path):
    import shutil

    reference_dir = tmp_path / "reference"
    config = CONFIG.replace(epochs=3, checkpoint_every=1, dp_secret="run_dir")
    reference = local(config.replace(out_dir=str(reference_dir)))
    # A copy of the run as it stood after epoch 2 (its two newest checkpoints are epochs 2 and 3):
    # resuming it redoes epoch 3 with the keys of the peers' files and checkpoints.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(reference_dir, resumed_dir)
    for path in (resumed_dir / "checkpoints").glob("rank-*-epoch-3.pt"):
        path.unlink()
    for name in ("summary.json", "summary.md"):
        (resumed_dir / name).unlink()
    resumed = local(config.replace(out_dir=str(resumed_dir)), resume=True)
    for rank in range(4):
        assert comparable(resumed[rank]["history"]) == comparable(reference[rank]["history"])
    assert resumed[0]["model_sha256"] == reference[0]["model_sha256"]

    keys = [(reference_dir / "secrets" / f"rank-{k}" / "key").read_bytes() for k in range(4)]
    assert len(set(keys)) == 4 and all(len(k) == 32 for k in keys)
    for k in range(4):
        path = reference_dir / "secrets" / f"rank-{k}" / "key"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(reference_dir / "secrets").st_mode) == 0o700
    # Never in what is shared or printed: not in the summary, the config, the metrics or a view.
    for path in reference_dir.rglob("*"):
        if path.is_file() and "secrets" not in path.parts and path.parent.name != "checkpoints":
            data = path.read_bytes()
            assert not any(k in data or k.hex().encode() in data for k in keys), path


def test_two_runs_with_os_entropy_draw_different_noise():
    first, second = local(CONFIG), local(CONFIG)
    assert first[0]["dp_randomness"] == "os"
    assert all(a != b for a, b in zip(first[0]["model_sha256"], second[0]["model_sha256"]))


def test_public_randomness_is_named_for_what_it_is():
    s = local(CONFIG.replace(dp_public_randomness=True))[0]
    assert "holds against outsiders only, not against the peers" in s["dp_randomness_note"]
    from gossip_powersgd.training.report import format_summary

    assert "outsiders only" in format_summary(s)


# ---- nothing data-dependent leaves a peer but its messages ---------------------------------------

SIZES = [137 + 41 * k for k in range(4)]  # shard sizes no other figure of the run takes


def own_data(rank, num_peers, seed=0):
    """Peer `rank`'s own training data (SIZES[rank] samples) and its own test set."""
    import numpy as np

    rng = np.random.default_rng([seed, rank])
    n = SIZES[rank]
    x = rng.standard_normal((n + 23, 20))
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] + 0.5 * rng.standard_normal(n + 23) > 0)
    return x[:n], y[:n], x[n:], y[n:]


LOCAL_DP = CONFIG.replace(
    partition="local",
    dataset="tests.privacy.test_seeds:own_data",
    public_train_size=sum(SIZES),
    epochs=2,
    log_every=3,
    quiet=False,
)


def _numbers(obj):
    """Every number in a JSON value (strings of digits left alone: digests are hex)."""
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _numbers(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _numbers(value)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


@pytest.mark.parametrize("dp", [True, False])
def test_no_peer_statistic_crosses_to_another_peer_or_into_rank_0s_output(
    tmp_path, monkeypatch, capsys, dp
):
    crossed = []  # what every collective carried, as the peers passed it in
    allreduce, allgather = LocalCommunicator.allreduce_, LocalCommunicator.allgather_bytes

    def spy_allreduce(self, tensor, *args, **kwargs):
        crossed.append(tensor.detach().double().reshape(-1).clone())
        return allreduce(self, tensor, *args, **kwargs)

    def spy_allgather(self, data, *args, **kwargs):
        crossed.append(bytes(data))
        return allgather(self, data, *args, **kwargs)

    monkeypatch.setattr(LocalCommunicator, "allreduce_", spy_allreduce)
    monkeypatch.setattr(LocalCommunicator, "allgather_bytes", spy_allgather)
    run_dir = tmp_path / "run"
    config = LOCAL_DP.replace(out_dir=str(run_dir))
    if not dp:
        config = config.replace(dp_noise_multiplier=None, dp_max_grad_norm=None)
    summaries = local(config)
    printed = capsys.readouterr().out

    peers = [json.loads((run_dir / "peers" / f"rank-{k}.json").read_text()) for k in range(4)]
    assert [p["shard_size"] for p in peers] == SIZES  # each peer's own file has its figures
    assert [sum(p["label_histogram"]) for p in peers] == SIZES
    # each peer's own training losses: in its eval records (2) and, private, its log records (4)
    losses = [
        r["train_loss_local"] for s in summaries for r in s["history"] if "train_loss_local" in r
    ]
    assert len(losses) >= 4 * 2 and all(math.isfinite(v) for v in losses)
    if dp:
        assert all(0 < p["epsilon_pld"] < p["epsilon"] for p in peers)
    private = set(SIZES) | set(losses)
    rows = [p["label_histogram"] for p in peers]
    for payload in crossed:
        values = set(payload.tolist()) if isinstance(payload, torch.Tensor) else set()
        assert not values & private, values & private
        if isinstance(payload, torch.Tensor):  # no histogram row, as consecutive values
            as_list = payload.tolist()
            assert not any(
                as_list[i : i + len(row)] == [float(v) for v in row]
                for row in rows
                for i in range(len(as_list))
            ), as_list
        assert not isinstance(payload, bytes) or not any(
            str(n).encode() in payload for n in SIZES
        ), payload
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "label_histogram" not in summary and summary["final_train_loss"] is None
    assert not set(_numbers(summary)) & private
    assert "epsilon" not in summary and "sample_rate" not in summary
    for text in (printed, (run_dir / "summary.md").read_text()):
        # rates and durations are wall-clock measurements, not data: a fast machine's
        # "219.0 steps/s" is no shard size (the figures a peer's data decides are left)
        text_of_data = re.sub(r"\d+(?:\.\d+)? (?:steps/s|s\b|ms\b)", "", text)
        numbers = {float(t) for t in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", text_of_data)}
        assert not numbers & set(map(float, SIZES)), numbers & set(map(float, SIZES))
        assert not re.search(r"train(ing)? loss\S* \d", text) and "histogram per peer" not in text
    assert "epoch 2/2" in printed  # rank 0 did print its progress lines


def test_a_damaged_key_file_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    config = CONFIG.replace(out_dir=str(run_dir), dp_secret="run_dir", checkpoint_every=1)
    local(config)
    (run_dir / "secrets" / "rank-2" / "key").write_bytes(b"short")
    with pytest.raises(ValueError, match=r"the DP key file .*rank-2/key is damaged") as info:
        local(config, resume=True)
    assert "\n" not in str(info.value)
