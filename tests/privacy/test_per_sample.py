"""Per-example clipping engines (`DPSGD(engine=...)`, `privacy/per_sample.py`) against torch.func.

The reference is computed independently of every engine: per-example gradients of each example's
own loss by ``torch.func.vmap(grad)``, clipped to C one by one and summed, in float64. Each engine
x layer type must give that clipped sum (the update with sigma = 0, times the batch size).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gossip_powersgd.privacy import DPSGD
from gossip_powersgd.privacy.per_sample import PerSampleModule
from gossip_powersgd.training.models import build_model

pytest.importorskip("opacus")

pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
    pytest.mark.filterwarnings("ignore:Using a non-full backward hook"),
]

BATCH = 12
NORM_EPS = 1e-6  # what DPSGD adds to every norm before dividing (as Opacus)


class Shared(nn.Module):
    """One Linear used twice in a forward: its per-example gradient is the sum of both uses'."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.inner(torch.tanh(self.inner(x)))))


class Sequence(nn.Module):
    """A Linear on (N, T, d) inputs: T positions per example (the Gram/gradient path)."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(4, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.mix(x.view(len(x), 3, 4))).mean(1))


def conv_model():
    """Conv1d without bias, with dilation and no padding, then GroupNorm and LayerNorm."""
    return nn.Sequential(
        nn.Unflatten(1, (2, 6)),
        nn.Conv1d(2, 4, 3, dilation=2, bias=False),
        nn.GroupNorm(2, 4),
        nn.Tanh(),
        nn.Flatten(),
        nn.LayerNorm(8),
        nn.Linear(8, 3),
    )


def strided_conv_model():
    """Conv1d with stride, padding and dilation after a Linear, so its input gradient matters."""
    return nn.Sequential(
        nn.Linear(12, 12),
        nn.Unflatten(1, (2, 6)),
        nn.Conv1d(2, 3, 3, stride=2, padding=2, dilation=2),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(9, 3),
    )


class SharedConv(nn.Module):
    """One Conv1d used twice (its uses add positions), then a Conv1d whose weight is frozen
    (its bias alone is clipped)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 2, 3, padding=1)
        self.bias_only = nn.Conv1d(2, 3, 2, stride=2)
        self.bias_only.weight.requires_grad_(False)
        self.head = nn.Linear(9, 3)

    def forward(self, x):
        h = torch.tanh(self.conv(torch.tanh(self.conv(x.view(len(x), 2, 6)))))
        return self.head(torch.tanh(self.bias_only(h)).flatten(1))


class PooledConv(nn.Module):
    """Conv1d over inputs of any length, averaged over positions: examples of 12 or 10 numbers."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3, padding=1)
        self.head = nn.Linear(3, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.conv(x.view(len(x), 2, -1))).mean(2))


def conv2d_model():
    """Conv2d has no ghost rule: the vmap engine takes it."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 3, 4)), nn.Conv2d(1, 2, 2), nn.Tanh(), nn.Flatten(), nn.Linear(12, 3)
    )


class Embedded(nn.Module):
    """Integer inputs through an Embedding (vmap engine), then a Linear (ghost)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.embed((x.abs() * 3).long().clamp(max=9)[:, :3]).sum(1))


def row_kinds_model():
    """Each kind of Linear layer `clip_rows` folds into the per-example norm: weight without bias,
    bias alone (a frozen weight), weight and bias."""
    model = nn.Sequential(
        nn.Linear(12, 7, bias=False), nn.Tanh(), nn.Linear(7, 7), nn.Tanh(), nn.Linear(7, 3)
    )
    model[2].weight.requires_grad_(False)
    return model


def layer_norm_without_bias_model():
    """A LayerNorm with a weight and no bias (``bias=False``): Opacus 1.6's hooks engine read the
    missing bias and failed in the backward."""
    return nn.Sequential(nn.Linear(12, 6), nn.Tanh(), nn.LayerNorm(6, bias=False), nn.Linear(6, 3))


CASES = {
    "logreg": lambda: build_model("logreg", input_shape=(12,), num_classes=3, seed=0),
    "mlp": lambda: build_model("mlp:7,5", input_shape=(12,), num_classes=3, seed=0),
    "cnn1d": lambda: build_model("cnn1d:channels=4", input_shape=(40,), num_classes=3, seed=0),
    "shared": Shared,
    "sequence": Sequence,
    "conv_norms": conv_model,
    "strided_conv": strided_conv_model,
    "conv2d": conv2d_model,
    "shared_conv": SharedConv,
    "pooled_conv": PooledConv,
    "embedding": Embedded,
    "row_kinds": row_kinds_model,
    "layer_norm_without_bias": layer_norm_without_bias_model,
}
INPUTS = {"cnn1d": 40, "shared": 6}


def make(case: str) -> nn.Module:
    """The same model every time (the custom ones draw from the global generator)."""
    torch.manual_seed(0)
    return CASES[case]()


def inputs(case: str, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, INPUTS.get(case, 12), generator=generator, dtype=torch.float64)
    return x, torch.randint(0, 3, (BATCH,), generator=generator)


def reference(model: nn.Module, x, y, clip: float):
    """(per-example gradients, clipped sum) by torch.func, one example's own loss at a time."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def loss(p, xi, yi):
        return F.cross_entropy(torch.func.functional_call(model, p, (xi[None],)), yi[None])

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    grads = [grads[n] for n, p in model.named_parameters() if p.requires_grad]
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads], 1).norm(dim=1)
    factors = (clip / (norms + NORM_EPS)).clamp(max=1.0)
    return grads, norms, [torch.einsum("i,i...->...", factors, g) for g in grads]


def private_sum(engine: str, model: nn.Module, x, y, clip: float):
    """The engine's clipped sum: the sigma = 0 update times the (expected = actual) batch size."""
    dp = DPSGD(0.0, clip, sample_rate=BATCH / 120, shard_size=120, engine=engine)
    wrapped = dp.wrap(model)
    wrapped.zero_grad(set_to_none=True)
    F.cross_entropy(wrapped(x), y).backward()
    dp.privatize(wrapped, BATCH)
    return [p.grad * BATCH for p in model.parameters() if p.requires_grad]


#: Opacus' engines on the layers the project's models use (Opacus' own tests cover the rest).
OPACUS_CASES = ("logreg", "mlp", "cnn1d", "conv_norms", "strided_conv", "layer_norm_without_bias")


@pytest.mark.parametrize(
    "engine, case",
    [(e, c) for e in ("ghost", "vmap") for c in CASES]
    + [(e, c) for e in ("hooks", "ew") for c in OPACUS_CASES],
)
def test_each_engine_gives_the_exact_clipped_sum_on_each_layer_type(engine, case):
    x, y = inputs(case)
    _, norms, expected = reference(make(case).double(), x, y, clip=1.0)
    clip = float(norms.median())  # about half the examples are clipped, half are not
    _, _, expected = reference(make(case).double(), x, y, clip=clip)
    assert (norms > clip).any() and (norms < clip).any()
    got = private_sum(engine, make(case).double(), x, y, clip)
    # float64: both sides sum at most a few hundred products in another order, so they agree to
    # ~1e-13 relative to the largest term (each term is at most C); 1e-10 leaves margin.
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10 * clip)


@pytest.mark.parametrize(
    "case", ["cnn1d", "shared", "sequence", "conv_norms", "strided_conv", "shared_conv"]
)
def test_gram_norms_used_for_large_layers_give_the_same_clipped_sum(case, monkeypatch):
    """Layers whose per-example gradients would not fit take the Gram form; forced here."""
    from gossip_powersgd.privacy import per_sample_layers

    monkeypatch.setattr(per_sample_layers, "MATERIALISE_LIMIT", 0)
    x, y = inputs(case)
    _, norms, _ = reference(make(case).double(), x, y, clip=1.0)
    clip = float(norms.median())
    _, _, expected = reference(make(case).double(), x, y, clip=clip)
    for mine, theirs in zip(private_sum("ghost", make(case).double(), x, y, clip), expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10 * clip)  # as above


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
@pytest.mark.parametrize(
    "case",
    [
        "mlp",
        "cnn1d",
        "shared",
        "sequence",
        "conv_norms",
        "strided_conv",
        "shared_conv",
        "embedding",
    ],
)
def test_materialised_per_example_gradients_equal_torch_func(engine, case):
    model = make(case).double()
    x, y = inputs(case)
    grads, _, _ = reference(model, x, y, clip=1.0)
    wrapped = PerSampleModule(model, engine)
    F.cross_entropy(wrapped(x), y).backward()
    for mine, theirs in zip(wrapped.per_example_gradients(BATCH), grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)  # float64, as above


@pytest.mark.parametrize("engine", ["hooks", "auto"])
def test_a_layer_norm_without_bias_trains_under_opacus_hooks_with_exact_per_example_gradients(
    engine,
):
    """Opacus' hooks engine (chosen, or picked by auto for a model with tied weights) crashed
    in the backward on a LayerNorm(bias=False): 'NoneType' object has no attribute
    'requires_grad'. Its per-example gradients now equal torch.func's, the LayerNorm's weight
    included, and no bias gradient is made up."""
    from opacus.grad_sample import GradSampleModule

    def model():
        torch.manual_seed(0)
        net = layer_norm_without_bias_model()
        if engine == "auto":  # a tied weight: auto takes Opacus' hooks
            net.insert(0, nn.Linear(12, 12, bias=False)).insert(1, nn.Linear(12, 12))
            net[1].weight = net[0].weight
        return net.double()

    x, y = inputs("layer_norm_without_bias")
    grads, _, _ = reference(model(), x, y, clip=1.0)
    dp = DPSGD(1.0, 1.0, sample_rate=BATCH / 120, shard_size=120, engine=engine)
    wrapped = dp.wrap(model())
    assert isinstance(wrapped, GradSampleModule)
    F.cross_entropy(wrapped(x), y).backward()
    got = dp.per_example_gradients(wrapped, BATCH)
    assert [tuple(g.shape) for g in got] == [tuple(g.shape) for g in grads]
    # float64: the LayerNorm weight's per-example gradient is the normalised input times the
    # output gradient (6 products, then the sum over the batch's own position), computed in another
    # order than torch.func's; normalising by a std of ~0.3 (tanh outputs) amplifies the rounding
    # (1e-16) a few times: ~1e-15, so 1e-10 leaves margin, as in the tests above.
    for mine, theirs in zip(got, grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)
    dp.privatize(wrapped, BATCH)  # the step goes on: clipped, noised
    assert all(torch.isfinite(p.grad).all() for p in wrapped.parameters())


def test_float32_built_in_models_match_the_float64_reference():
    for case in ("mlp", "cnn1d"):
        x, y = inputs(case)
        _, norms, _ = reference(make(case).double(), x, y, clip=1.0)
        clip = float(norms.median())
        _, _, expected = reference(make(case).double(), x, y, clip=clip)
        got = private_sum("ghost", make(case), x.float(), y, clip)
        # float32 rounding (2^-24 ~ 6e-8) through a forward and a backward of a few layers
        for mine, theirs in zip(got, expected):
            torch.testing.assert_close(mine.double(), theirs, rtol=1e-4, atol=1e-5 * clip)


@pytest.mark.parametrize("case", ["row_kinds", "shared", "sequence", "conv_norms"])
def test_float32_norms_of_each_linear_kind_and_their_mix_with_other_layers(case):
    """The clipped sum in float32 against the float64 torch.func reference, on the same
    (float32-exact) parameters: each kind of Linear `clip_rows` folds into the per-example norm
    (weight alone, bias alone, both), and its norms combined with those of the other layers (a
    Linear used twice, a Linear on sequences, Conv1d with GroupNorm and LayerNorm)."""
    x, y = inputs(case)
    _, norms, _ = reference(make(case).double(), x, y, clip=1.0)
    clip = float(norms.median())
    _, _, expected = reference(make(case).double(), x, y, clip=clip)
    got = private_sum("ghost", make(case), x.float(), y, clip)
    # Each entry sums BATCH = 12 clipped terms, each at most C in size. A term goes through a
    # forward and a backward of at most 3 layers of fan-in <= 12 and a norm in float32 (unit
    # roundoff u = 2^-24 = 6e-8): relative error below ~30 u, so the sum is within
    # 12 * 30 u * C = 2e-5 C (measured: 2.4e-7 C). A wrong norm (a layer's term left out or
    # counted twice) moves the clip factors, hence the entries, by orders of magnitude more.
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine.double(), theirs, rtol=0, atol=2e-5 * clip)


def test_frozen_and_unused_parameters():
    """A frozen weight gets no gradient and its bias is still clipped with the rest; a trainable
    layer the forward does not use contributes zero (its update is pure noise)."""
    model = nn.Sequential(nn.Linear(12, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    model[0].weight.requires_grad_(False)
    unused = nn.Linear(2, 2).double()
    holder = nn.ModuleDict({"net": model, "unused": unused})
    holder.forward = model.forward  # the wrapper calls the container; only `net` runs
    x, y = inputs("mlp")
    _, norms, expected = reference(model, x, y, clip=1.0)
    clip = float(norms.median())
    _, _, expected = reference(model, x, y, clip=clip)
    got = private_sum("ghost", holder, x, y, clip)
    assert len(got) == len(expected) + 2
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10 * clip)
    assert all(torch.count_nonzero(g) == 0 for g in got[len(expected) :])
    assert model[0].weight.grad is None


def test_several_backward_passes_and_a_wrong_batch_size_are_one_line_errors():
    dp = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=40, engine="ghost")
    model = dp.wrap(make("mlp"))
    x, y = inputs("mlp")
    for _ in range(2):
        F.cross_entropy(model(x.float()), y).backward()
    with pytest.raises(ValueError, match="several forward/backward passes") as info:
        dp.privatize(model, BATCH)
    assert "\n" not in str(info.value)
    model.clear()
    F.cross_entropy(model(x.float()), y).backward()
    with pytest.raises(ValueError, match=f"told the batch has {BATCH - 1} examples"):
        dp.privatize(model, BATCH - 1)


def test_auto_picks_ghost_for_the_built_in_models_and_opacus_for_other_layers():
    from opacus.grad_sample import GradSampleModule

    for case in ("logreg", "mlp", "cnn1d", "conv_norms", "embedding"):
        wrapped = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=40).wrap(make(case))
        assert isinstance(wrapped, PerSampleModule) and wrapped.engine == "ghost"
    rnn = nn.Sequential(nn.Linear(4, 4), nn.RNN(4, 4, batch_first=True))
    assert isinstance(DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=40).wrap(rnn), GradSampleModule)


class TiedEmbedding(nn.Module):
    """An Embedding and the decoder that reuses its matrix (tied weights), a Linear between."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.mid = nn.Linear(4, 4)
        self.decode = nn.Linear(4, 10)
        self.decode.weight = self.embed.weight

    def forward(self, x):
        tokens = (x.abs() * 3).long().clamp(max=9)[:, :3]
        return self.decode(torch.tanh(self.mid(self.embed(tokens)))).mean(1)


class TiedLinear(nn.Module):
    """Two Linear layers holding one weight (their biases their own), then a head."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(12, 12)
        self.second = nn.Linear(12, 12)
        self.second.weight = self.first.weight
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.second(torch.tanh(self.first(x)))))


@pytest.mark.parametrize("tied", [TiedEmbedding, TiedLinear], ids=["embedding", "linear"])
def test_tied_weights_take_opacus_hooks_under_auto_and_are_refused_by_ghost_and_vmap(tied):
    """A parameter shared by two layers: each layer's records hold only its part of an example's
    gradient, and the norm of their sum needs the cross terms. ghost and vmap crashed on it
    (a TypeError 40 lines deep); now they refuse it in one line, and auto picks Opacus' hooks,
    which add the parts into one per-example gradient: the exact clipped sum."""
    from opacus.grad_sample import GradSampleModule

    def model():
        torch.manual_seed(0)
        return tied().double()

    x, y = inputs("tied")
    _, norms, _ = reference(model(), x, y, clip=1.0)
    clip = float(norms.median())
    _, _, expected = reference(model(), x, y, clip=clip)
    assert (norms > clip).any() and (norms < clip).any()
    dp = DPSGD(0.0, clip, sample_rate=BATCH / 120, shard_size=120)
    assert isinstance(dp.wrap(model()), GradSampleModule)
    got = private_sum("auto", model(), x, y, clip)
    assert len(got) == len(expected)  # the shared matrix once
    # float64, as in test_each_engine_gives_the_exact_clipped_sum_on_each_layer_type: the shared
    # matrix's sum adds both layers' parts (a few hundred products) in another order: ~1e-13
    # at most (measured: 6e-16 C).
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10 * clip)
    first = next(n for n, p in model().named_parameters() if p.dim() == 2)
    for engine in ("ghost", "vmap"):
        with pytest.raises(ValueError) as info:
            DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=40, engine=engine).wrap(model())
        text = str(info.value)
        assert "\n" not in text and f"the {engine} engine cannot clip" in text
        assert f"'{first}' of layers" in text and "engine='hooks'" in text


def test_engines_keep_opacus_parameter_names_so_checkpoints_load_across_them():
    names = {
        engine: list(
            DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=40, engine=engine)
            .wrap(make("cnn1d"))
            .state_dict()
        )
        for engine in ("ghost", "hooks")
    }
    assert names["ghost"] == names["hooks"] and names["ghost"][0].startswith("_module.")


def test_bad_engine_and_unsupported_nesting_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown per-example gradient engine 'fast'.*ghost"):
        DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=40, engine="fast")

    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))
            self.inner = nn.Linear(3, 3)

        def forward(self, x):
            return self.inner(x) * self.scale

    with pytest.raises(ValueError, match="layer '<root>' \\(Nested\\).*engine='hooks'"):
        PerSampleModule(Nested(), "ghost")


def test_empty_batch_after_a_forward_without_backward_is_pure_noise():
    dp = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=40, engine="ghost")
    model = dp.wrap(make("cnn1d"))
    with torch.no_grad():
        model(inputs("cnn1d")[0].float())  # an evaluation records nothing
    dp.privatize(model, 0)
    assert all(
        p.grad is not None and math.isfinite(float(p.grad.abs().sum())) for p in model.parameters()
    )


def test_an_in_place_change_of_a_recorded_output_is_refused_and_vmap_takes_it():
    """The ghost engine retains the gradient of each Linear's output; ReLU(inplace=True) would move
    it to the ReLU's output (a wrong norm), so the changed version is a one-line error, and the
    vmap engine, whose hooks see the gradient before the change, gives the exact sum. The first
    layer's retained tensor is not its output: an in-place change there is fine."""

    def model():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(12, 7),
            nn.ReLU(inplace=True),
            nn.Linear(7, 7),
            nn.ReLU(inplace=True),
            nn.Linear(7, 3),
        ).double()

    x, y = inputs("mlp")
    _, norms, _ = reference(model(), x, y, clip=1.0)
    clip = float(norms.median())
    _, _, expected = reference(model(), x, y, clip=clip)
    with pytest.raises(
        ValueError,
        match=r"layer .2. \(Linear\) was changed in place.*"
        r"inplace=False",
    ) as info:
        private_sum("ghost", model(), x, y, clip)
    assert "\n" not in str(info.value)
    for mine, theirs in zip(private_sum("vmap", model(), x, y, clip), expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10 * clip)  # as above


@pytest.mark.parametrize("case", ["cnn1d", "shared_conv", "pooled_conv"])
def test_steps_with_varying_batch_sizes_reuse_memory_and_stay_exact(case):
    """Poisson batches vary in size (and a sequence model's inputs in length): the convolutions'
    scratch memory (unfolded inputs with their row of ones for the bias, per-example gradients)
    is reused and re-cut from step to step; each step's clipped sum must still be its own
    batch's exact one (float64, as above)."""
    wrapped = PerSampleModule(make(case).double(), "ghost")
    steps = [(BATCH, 12), (7, 12), (BATCH, 12), (15, 12), (15, 12)]
    if case == "pooled_conv":  # shorter examples move the row of ones within the memory
        steps += [(15, 10), (7, 12), (7, 10), (BATCH, 12)]
    for seed, (size, length) in enumerate(steps):
        generator = torch.Generator().manual_seed(seed)
        width = INPUTS.get(case, 12) if length == 12 else length
        x = torch.randn(size, width, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 3, (size,), generator=generator)
        _, norms, _ = reference(make(case).double(), x, y, clip=1.0)
        clip = float(norms.median())
        _, _, expected = reference(make(case).double(), x, y, clip=clip)
        wrapped.zero_grad(set_to_none=True)
        F.cross_entropy(wrapped(x), y).backward()
        got = wrapped.clipped_sum(clip, size, NORM_EPS)
        for mine, theirs in zip(got, expected):
            torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10 * clip)


def test_an_in_place_change_of_a_convolution_input_after_its_use_is_refused():
    """The ghost engine keeps a Conv1d's input and unfolds it after the backward. Autograd itself
    refuses an input it saved that was changed in place, but the first layer's input (data, no
    gradient) is saved by no one: changed after the convolution used it, it would give wrong
    per-example gradients, so it is a one-line error."""

    class Changes(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 3, 3)
            self.head = nn.Linear(12, 3)

        def forward(self, x):
            h = x.view(len(x), 2, 6)
            out = self.conv(h)
            h.mul_(2.0)  # e.g. normalising the batch in place after the first layer read it
            return self.head(torch.tanh(out).flatten(1))

    torch.manual_seed(0)
    x, y = inputs("mlp")
    with pytest.raises(
        ValueError, match=r"input of layer .conv. \(Conv1d\) was changed in place"
    ) as info:
        private_sum("ghost", Changes().double(), x, y, 1.0)
    assert "\n" not in str(info.value)


def test_a_forward_without_backward_before_the_step_changes_nothing():
    """An evaluation in grad mode (forward, no backward) leaves records no backward reaches: the
    next forward forgets them, and the step's clipped sum is that of its own backward alone."""
    x, y = inputs("cnn1d")
    _, norms, _ = reference(make("cnn1d").double(), x, y, clip=1.0)
    clip = float(norms.median())
    _, _, expected = reference(make("cnn1d").double(), x, y, clip=clip)
    dp = DPSGD(0.0, clip, sample_rate=BATCH / 120, shard_size=120, engine="ghost")
    model = dp.wrap(make("cnn1d").double())
    model(inputs("cnn1d", seed=2)[0])  # grad mode, never backpropagated
    assert all(len(layer.records) == 1 for layer in model.layers)
    F.cross_entropy(model(x), y).backward()
    assert all(len(layer.records) == 1 for layer in model.layers)  # the first pass forgotten
    dp.privatize(model, BATCH)
    for p, theirs in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad * BATCH, theirs, rtol=1e-10, atol=1e-10 * clip)


@pytest.mark.parametrize("engine, case", [(e, c) for e in ("ghost", "vmap") for c in CASES])
def test_a_copy_computes_with_its_own_parameters_and_clips_as_the_original(engine, case):
    """`copy.deepcopy` of a wrapped model (the averaged model of a run is one: `setup` copies the
    peer's model and loads the peers' average into it). Before, the copy's patched forwards ran the
    original's layers, so whatever was loaded into the copy, it computed the original's outputs:
    every averaged-model figure under DP was the peer's own model's. Now the copy, given other
    parameters, computes exactly what a plain module with those parameters does (in evaluation and
    in training), its clipped sum is the reference one at those parameters, and the original is
    untouched."""
    import copy

    x, y = inputs(case)
    original = PerSampleModule(make(case).double(), engine)
    copied = copy.deepcopy(original)
    moved = {n: p.detach() + 0.25 for n, p in make(case).double().named_parameters()}
    with torch.no_grad():
        for name, p in copied._module.named_parameters():
            p.copy_(moved[name])
    plain = make(case).double()
    plain.load_state_dict(copied._module.state_dict())
    with torch.no_grad():  # the same operations on the same numbers: equal to the bit
        assert torch.equal(copied(x), plain(x))
        assert torch.equal(original(x), make(case).double()(x))
    clip = 1.0
    _, _, expected = reference(plain, x, y, clip)
    copied.zero_grad(set_to_none=True)
    F.cross_entropy(copied(x), y).backward()
    got = copied.clipped_sum(clip, BATCH, NORM_EPS)
    # float64, as in test_each_engine_gives_the_exact_clipped_sum_on_each_layer_type
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10 * clip)
