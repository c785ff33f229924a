"""A private language model: `lstm_lm` trains under DP-SGD.

nn.LSTM runs as a fused kernel whose per-example gradients no engine can see into; DP-SGD swaps it
for Opacus' DPLSTM (same function, same parameters, made of linear layers Opacus' hooks record),
without `dp_fix_model` (`privacy.model_check`). Checked: the swapped model computes what the
original does; a private step's clipped sum equals, parameter by parameter, a loop over the
examples of the original model (torch.autograd per example, clipped to C over all parameters
together, summed, divided by the batch), the tied embedding/decoder weight included; a small
private run on WikiText-2-format files learns (its perplexity falls below the initial model's).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training.config import TrainConfig
from gossip_powersgd.training.models import build_model
from gossip_powersgd.training.trainer import train

import paper_fixtures

pytest.importorskip("opacus")

# Opacus' hooks on a first layer whose input needs no gradient (the embedding) make torch warn at
# every backward; the gradients are right, which is what the first test checks.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

VOCABULARY, BPTT, BATCH = 11, 5, 6


def tiny_lm(layers: int, tied: bool):
    spec = f"lstm_lm:layers={layers},hidden=6,dropout=0,tied={str(tied).lower()}"
    if not tied:
        spec += ",embedding=4"
    return build_model(spec, (BPTT,), VOCABULARY, seed=3)


@pytest.mark.parametrize("layers, tied", [(1, True), (2, False)])
def test_a_private_lstm_step_clips_each_examples_gradient(layers, tied):
    from gossip_powersgd.privacy.dpsgd import DPSGD
    from gossip_powersgd.privacy.model_check import validate_model

    original = tiny_lm(layers, tied)
    rng_state = torch.random.get_rng_state()
    swapped = validate_model(original)  # no dp_fix_model needed
    assert torch.equal(rng_state, torch.random.get_rng_state())  # the global RNG untouched
    assert swapped is not original and not any(
        isinstance(m, torch.nn.LSTM) for m in swapped.modules()
    )
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCABULARY, (BATCH, BPTT), generator=generator)
    y = torch.randint(0, VOCABULARY, (BATCH, BPTT), generator=generator)
    with torch.no_grad():  # the same function (float rounding of a different summation order)
        assert torch.allclose(swapped(x), original(x), atol=1e-6)

    clip = 0.05  # below every example's gradient norm: each one is clipped
    dp = DPSGD(0.0, clip, BATCH / 60, 60, randomness=None)
    model = dp.wrap(swapped)
    from opacus.grad_sample import GradSampleModule

    assert isinstance(model, GradSampleModule)  # Opacus' hooks record the DPLSTM's pieces
    logits = model(x)
    F.cross_entropy(logits.reshape(-1, VOCABULARY), y.reshape(-1)).backward()
    dp.privatize(model, BATCH)
    private = {n.removeprefix("_module."): p.grad for n, p in model.named_parameters()}

    names = [n for n, _ in original.named_parameters()]  # the tied weight once
    assert sorted(names) == sorted(private)
    expected = {n: torch.zeros_like(p) for n, p in original.named_parameters()}
    norms = []
    for i in range(BATCH):  # each example's own mean-token loss, through the original nn.LSTM
        original.zero_grad()
        out = original(x[i : i + 1])
        F.cross_entropy(out.reshape(-1, VOCABULARY), y[i].reshape(-1)).backward()
        grads = {n: p.grad.detach().clone() for n, p in original.named_parameters()}
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
        norms.append(float(norm))
        factor = min(1.0, clip / (float(norm) + 1e-6))
        for n in names:
            expected[n] += factor * grads[n] / BATCH  # divided by the expected batch, 6
    assert min(norms) > clip
    for n in names:
        # float32 sums of a handful of products of values below 1: a few ulps of the norm
        assert torch.allclose(private[n], expected[n], atol=1e-7, rtol=1e-4), n


def test_a_tiny_private_language_model_trains(tmp_path):
    """Two peers, WikiText-2-format files whose training text repeats a few sentences, DP-SGD with
    sigma 0.5: each peer's training loss falls from about ln(vocabulary), a uniform guess's, to
    below 0.6 of it (ln 12 = 2.48; four runs ended at 0.73, 0.86, 1.09 and 0.85, all from above
    2.4). The fixture's test text holds words the training text never has, so its perplexity says
    nothing here."""
    paper_fixtures.write_wikitext2(tmp_path, repeat=40)
    config = TrainConfig(
        topology="ring:2",
        dataset=f"wikitext2:root={tmp_path},bptt=6",
        partition="contiguous",
        model="lstm_lm:layers=1,hidden=16",
        lr=5.0,
        batch_size=32,
        epochs=10,
        quiet=True,
        checkpoint_every=0,
        dp_noise_multiplier=0.5,
        dp_max_grad_norm=1.0,
    )
    summaries = LocalCluster(topologies.parse("ring:2"), timeout=300).run(train, config)
    from gossip_powersgd.training.data import load_dataset

    uniform = math.log(load_dataset(config.dataset).num_classes)
    for s in summaries:
        losses = [r["train_loss_local"] for r in s["history"] if r["kind"] == "eval"]
        assert losses[0] > 0.8 * uniform and losses[-1] < 0.6 * uniform, losses
        peer = s["peer"]
        assert 0 < peer["epsilon"] < math.inf and peer["noise_multiplier"] == 0.5
