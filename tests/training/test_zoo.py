"""The paper's models (ResNet-20, VGG-16, the LSTM language model) and constructor options."""

import os
import sys

import pytest
import torch
from torch import nn

from gossip_powersgd.training.models import build_model, count_parameters

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
)  # "byo_fixtures:..." specs


def states_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def resnet20_count(width, classes, channels=3):
    """Closed form: stem conv + BN, 9 blocks of two conv3x3 + BN, two 1x1 + BN shortcuts, fc."""
    w = width
    total = channels * w * 9 + 2 * w
    c_in = w
    for c in (w, 2 * w, 4 * w):
        total += c_in * c * 9 + 2 * c + c * c * 9 + 2 * c  # first block of the stage
        if c != c_in:
            total += c_in * c + 2 * c  # its 1x1 shortcut and BN
        total += 2 * (2 * (c * c * 9 + 2 * c))  # the other two blocks
        c_in = c
    return total + 4 * w * classes + classes


def test_resnet20_is_the_choco_version():
    model = build_model("resnet20", (3, 32, 32), 10, seed=0)
    assert count_parameters(model) == 272_474  # Tao Lin's / the PowerGossip paper's ResNet-20
    assert resnet20_count(16, 10) == 272_474
    assert count_parameters(build_model("resnet20:width=4", (3, 8, 8), 7, 0)) == resnet20_count(
        4, 7
    )
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 19 + 2  # 19 after convolutions, 2 in the shortcuts
    conv = model.conv1.weight  # He-normal, fan-out 3*3*16: std sqrt(2/144)
    assert abs(conv.std().item() / (2 / 144) ** 0.5 - 1) < 0.15  # 432 draws: std error ~3.4 %


def test_vgg16_with_and_without_batch_norm():
    with_bn = build_model("vgg16:width=8", (3, 32, 32), 10, seed=1)
    without = build_model("vgg16:bn=false,width=8", (3, 32, 32), 10, seed=1)
    convs = [m for m in with_bn.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 13 and sum(isinstance(m, nn.Linear) for m in with_bn.modules()) == 3
    assert sum(isinstance(m, nn.BatchNorm2d) for m in with_bn.modules()) == 13
    assert not any(isinstance(m, nn.BatchNorm2d) for m in without.modules())
    # without BN each conv has a bias instead of BN's weight and bias: 13 x c fewer parameters
    assert count_parameters(with_bn) - count_parameters(without) == sum(
        c.out_channels for c in convs
    )
    assert with_bn(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    full = build_model("vgg16", (3, 32, 32), 10, seed=0)
    widths = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    convs = sum(9 * a * b + 2 * b for a, b in zip([3] + widths[:-1], widths))
    assert count_parameters(full) == convs + 2 * (512 * 512 + 512) + 512 * 10 + 10


def test_lstm_lm_options_and_tied_embedding():
    spec = "lstm_lm:layers=3,hidden=16,tied=true,dropout=0.4"
    model = build_model(spec, (7,), 50, seed=2)
    assert model.decoder.weight is model.encoder.weight
    assert len(model.rnns) == 3 and model.rnns[0].hidden_size == 16
    assert [d.p for d in model.drops] == [0.4] * 4
    out = model(torch.randint(0, 50, (4, 7)))
    assert out.shape == (4, 7, 50)  # a prediction per token
    lstm = 4 * 16 * (16 + 16) + 2 * 4 * 16  # per layer: four gates over [input, hidden], 2 biases
    assert count_parameters(model) == 50 * 16 + 3 * lstm + 50
    untied = build_model("lstm_lm:layers=1,hidden=8,embedding=5,tied=false", (7,), 50, seed=2)
    assert untied.decoder.weight is not untied.encoder.weight
    assert untied.encoder.weight.shape == (50, 5)
    assert 0 < model.encoder.weight.abs().max() <= 0.1  # U(-0.1, 0.1)
    assert torch.equal(model.decoder.bias, torch.zeros(50))


@pytest.mark.parametrize(
    "spec, shape",
    [("resnet20:width=4", (3, 8, 8)), ("vgg16:width=4", (3, 32, 32)), ("lstm_lm:hidden=8", (5,))],
)
def test_deterministic_from_the_seed_and_rng_untouched(spec, shape):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = build_model(spec, shape, 10, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert states_equal(a, build_model(spec, shape, 10, seed=3))
    assert not states_equal(a, build_model(spec, shape, 10, seed=4))
    assert all(torch.isfinite(t).all() for t in a.state_dict().values())


def test_bring_your_own_keyword_options():
    model = build_model("byo_fixtures:options_net:width=6,bias=false,act=tanh", (2, 3), 4, seed=0)
    first = model[1]
    assert first.out_features == 6 and first.bias is None and isinstance(model[2], nn.Tanh)
    assert states_equal(
        model,
        build_model("byo_fixtures:options_net:width=6,bias=false,act=tanh", (2, 3), 4, seed=0),
    )
    assert build_model("byo_fixtures:options_net", (2, 3), 4, seed=0)[1].out_features == 4


@pytest.mark.parametrize(
    "spec, shape, match",
    [
        ("resnet20:depth=32", (3, 32, 32), "unknown option 'depth'"),
        ("resnet20:width=0", (3, 32, 32), "width must be >= 1"),
        ("resnet20:width=abc", (3, 32, 32), "width must be an integer"),
        ("resnet20", (40,), "image inputs"),
        ("vgg16", (3, 16, 16), "at least 32x32"),
        ("vgg16:bn=maybe", (3, 32, 32), "bn must be true or false"),
        ("lstm_lm:dropout=1", (5,), "dropout must be < 1"),
        ("lstm_lm:embedding=4,hidden=8", (5,), "tied=true needs embedding == hidden"),
        ("lstm_lm", (3, 32, 32), "token sequences"),
        ("byo_fixtures:options_net:depth=3", (4,), "takes no keyword argument 'depth'"),
        ("byo_fixtures:options_net:width", (4,), "not key=value"),
    ],
)
def test_bad_options(spec, shape, match):
    with pytest.raises(ValueError, match=match) as info:
        build_model(spec, shape, 10, seed=0)
    assert "\n" not in str(info.value)


def test_dropout_draws_from_the_model_not_the_global_rng():
    import copy

    model = build_model("lstm_lm:layers=2,hidden=8,dropout=0.5", (5,), 20, seed=0).train()
    x = torch.randint(0, 20, (3, 5))
    saved = copy.deepcopy(model.state_dict())
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first, second = model(x), model(x)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert not torch.equal(first, second)  # fresh masks at every forward
    model.load_state_dict(saved)  # the masks' generator is checkpointed with the model
    assert torch.equal(model(x), first)
    model.eval()
    assert torch.equal(model(x), model(x))


# ---- Reliability IV: truncated BPTT and each peer's own dropout masks ------------------------------


def test_lstm_carries_its_detached_state_across_batches_of_a_stream():
    """With carry_state, reading a stream in two windows gives exactly the logits of reading it at
    once (the second window starts from the first's final state), and no gradient reaches the
    first window from the second's loss (detached); rows continue rows, a shorter batch takes
    the first rows; reset_state starts again from zero."""
    model = build_model("lstm_lm:layers=2,hidden=8,dropout=0", (6,), 20, seed=0).train()
    stream = torch.randint(0, 20, (3, 12))
    whole = model(stream)
    model.carry_state = True
    first = model(stream[:, :6])
    second = model(stream[:, 6:])
    # float32 LSTM cells: the same operations in the same order, up to the split of one matmul
    assert torch.allclose(torch.cat([first, second], 1), whole, atol=1e-6)
    second.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.reset_state()
    assert torch.allclose(model(stream[:, :6]), whole[:, :6], atol=1e-6)
    assert torch.allclose(model(stream[:2, 6:]), whole[:2, 6:], atol=1e-6)  # the first 2 rows
    model.carry_state = False
    model.reset_state()
    assert not torch.allclose(model(stream[:, 6:]), whole[:, 6:], atol=1e-3)  # zero state


def test_each_peer_draws_its_own_dropout_masks():
    """Peers build the same weights from the seed; seed_dropout_per_peer gives each its own mask
    stream (a pure function of seed and rank), so that peers do not drop the same units."""
    from gossip_powersgd.training.zoo import seed_dropout_per_peer

    x = torch.ones(4, 64, dtype=torch.long)
    masks = {}
    for rank in (0, 1, 0):
        model = build_model("lstm_lm:layers=1,hidden=16,dropout=0.5", (64,), 8, seed=3).train()
        seed_dropout_per_peer(model, 3, rank)
        dropped = model.drops[0](torch.ones(4, 64, 16)) == 0
        masks.setdefault(rank, []).append(dropped)
        assert model(x).shape == (4, 64, 8)
    assert torch.equal(masks[0][0], masks[0][1])  # reproducible
    assert not torch.equal(masks[0][0], masks[1][0])  # per peer
    shared = build_model("lstm_lm:layers=1,hidden=16,dropout=0.5", (64,), 8, seed=3)
    peer = build_model("lstm_lm:layers=1,hidden=16,dropout=0.5", (64,), 8, seed=3)
    seed_dropout_per_peer(peer, 3, 1)
    weights = [k for k in shared.state_dict() if not k.endswith("rng_state")]
    assert all(torch.equal(shared.state_dict()[k], peer.state_dict()[k]) for k in weights)
