"""Per-peer DP-SGD: per-example clipping and Gaussian noise on each peer's own gradient.

Each peer privatizes its own gradient before its optimizer step, then gossips as usual: what
leaves a peer is already private, whatever gossip algorithm carries it (post-processing). This is
why there is no DistributedDataParallel here: Opacus' distributed optimizer adds the noise on one
rank only, which protects the average, not each peer's records.

How a trainer uses it, per peer::

    options checked      validate_dp_options(sigma, C, delta, target, accountant)
    set-up               model = validate_model(model, fix)   # before building the optimizer
                         randomness = Randomness.os_entropy()  # the peer's secret key
                         dp = DPSGD(sigma, C, q, n, randomness=randomness)
                         model = dp.wrap(model)               # records per-example pieces
                         batches = PoissonBatches(x, y, q, randomness=randomness)
    after backward       dp.privatize(model, len(yb))         # empty batch: no forward, just this
    evaluation           dp.epsilon(delta)
    checkpoint           dp.state_dict() / dp.load_state_dict(state)
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Optional

import torch
from torch import nn

from gossip_powersgd.privacy.accounting import check_accountant_name, epsilon, make_accountant
from gossip_powersgd.privacy.dependency import import_opacus
from gossip_powersgd.privacy.model_check import register_layer_norm_sampler, validate_model
from gossip_powersgd.privacy.per_sample import PerSampleModule, shared_parameter
from gossip_powersgd.privacy.seeds import NOISE_STREAM, Randomness

__all__ = ["DPSGD", "validate_model", "validate_dp_options", "dp_enabled", "GRAD_SAMPLE_ENGINES"]

#: How per-example clipping is computed (`DPSGD(engine=...)`): "auto" (the default: "ghost" unless
#: a trainable layer is one the vmap engine cannot take or a parameter is shared by several
#: layers, then "hooks"), "ghost" (ghost norms and book-keeping for Linear and Conv1d, vmap for
#: other layers; `per_sample.py`), "vmap" (torch.func for every layer), and Opacus'
#: GradSampleModule modes "hooks" and "ew" (expanded weights).
GRAD_SAMPLE_ENGINES = ("auto", "ghost", "vmap", "hooks", "ew")

#: Layers whose forward takes a batch and returns one tensor, which the vmap engine differentiates.
_VMAP_LAYERS = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.Embedding,
    nn.PReLU,
    nn.modules.instancenorm._InstanceNorm,
)

#: Added to each per-example norm before dividing, as Opacus does, so a zero gradient stays zero.
_NORM_EPS = 1e-6


def dp_enabled(noise_multiplier: Optional[float], target_epsilon: Optional[float]) -> bool:
    """Differential privacy is on exactly when sigma or a target epsilon is set."""
    return noise_multiplier is not None or target_epsilon is not None


def _number(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(float(value)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def validate_dp_options(
    noise_multiplier: Optional[float] = None,
    max_grad_norm: Optional[float] = None,
    delta: Optional[float] = None,
    target_epsilon: Optional[float] = None,
    accountant: str = "rdp",
) -> None:
    """One-line ValueError for the first bad differential-privacy option; None when all are fine.

    ``None`` means "not set". sigma = 0 with C = inf is allowed (it reproduces plain SGD, a
    check of the machinery, with an infinite epsilon); noise with C = inf is not.
    """
    if noise_multiplier is not None and target_epsilon is not None:
        raise ValueError(
            "set either dp_noise_multiplier or dp_target_epsilon, not both "
            "(the target computes the noise multiplier)"
        )
    if noise_multiplier is not None:
        sigma = _number("dp_noise_multiplier", noise_multiplier)
        if not 0 <= sigma < math.inf:
            raise ValueError(f"dp_noise_multiplier must be a finite number >= 0, got {sigma:g}")
    if target_epsilon is not None:
        target = _number("dp_target_epsilon", target_epsilon)
        if not 0 < target < math.inf:
            raise ValueError(f"dp_target_epsilon must be a finite number > 0, got {target:g}")
    if delta is not None:
        d = _number("dp_delta", delta)
        if not 0 < d < 1:
            raise ValueError(f"dp_delta must lie strictly between 0 and 1, got {d:g}")
    check_accountant_name(accountant)
    if not dp_enabled(noise_multiplier, target_epsilon):
        return
    if max_grad_norm is None:
        raise ValueError(
            "differential privacy needs dp_max_grad_norm (the per-example clipping "
            "norm C), e.g. dp_max_grad_norm: 1.0"
        )
    clip = _number("dp_max_grad_norm", max_grad_norm)
    if not clip > 0:
        raise ValueError(f"dp_max_grad_norm must be > 0, got {clip:g}")
    noisy = target_epsilon is not None or float(noise_multiplier) > 0
    if noisy and math.isinf(clip):
        raise ValueError(
            "dp_max_grad_norm must be finite when noise is added (the noise std is "
            "dp_noise_multiplier * dp_max_grad_norm)"
        )


def _auto_engine(model: nn.Module) -> str:
    """ "ghost" when every trainable layer is one it (or its vmap fallback) handles and no
    parameter is shared by several layers (tied weights, `per_sample.shared_parameter`), else
    "hooks"."""
    if shared_parameter(model) is not None:
        return "hooks"
    for module in model.modules():
        if any(p.requires_grad for p in module.parameters(recurse=False)) and not isinstance(
            module, _VMAP_LAYERS
        ):
            return "hooks"
    return "ghost"


class DPSGD:
    """One peer's DP-SGD step: clip each example's gradient to C, sum, add N(0, (sigma C)^2).

    The sum is divided by a public number, ``divisor``: by default the *expected* batch size
    ``sample_rate * shard_size`` (the configured batch size when the rate is batch / shard size),
    never the batch's actual size, which would depend on (and leak) how many records were
    sampled. A peer whose rate is capped below batch / shard size (a shard smaller than the
    batch, or a target epsilon's public rate, see `privacy.training`) passes the configured
    batch size, so that the noise's scale sigma C / divisor says nothing about its shard. The noise
    comes from this peer's secret keystream ``randomness`` (`seeds.Randomness`; default: a fresh
    OS-entropy key), at the label (NOISE_STREAM, step, 0), one draw for all parameters in the
    model's order (step: `own_steps`): step t's noise depends only on the key and t, so a run
    resumed with the same key draws the same noise (`releases`), and nobody without the key (a
    neighbour knowing the whole config) can regenerate it. Share the same `Randomness` with the peer's
    `PoissonBatches` (another stream tag): one key per peer.
    """

    def __init__(
        self,
        noise_multiplier: float,
        max_grad_norm: float,
        sample_rate: float,
        shard_size: int,
        *,
        accountant: str = "rdp",
        randomness: Optional[Randomness] = None,
        engine: str = "auto",
        divisor: Optional[float] = None,
    ):
        validate_dp_options(
            noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, accountant=accountant
        )
        if engine not in GRAD_SAMPLE_ENGINES:
            raise ValueError(
                f"unknown per-example gradient engine {engine!r}; choose one of "
                f"{', '.join(GRAD_SAMPLE_ENGINES)}"
            )
        if isinstance(sample_rate, bool) or not 0 < float(sample_rate) <= 1:
            raise ValueError(f"the sample rate must lie in (0, 1], got {sample_rate!r}")
        if isinstance(shard_size, bool) or int(shard_size) != shard_size or shard_size < 1:
            raise ValueError(f"the shard size must be a positive integer, got {shard_size!r}")
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.sample_rate = float(sample_rate)
        if divisor is not None and not (isinstance(divisor, Real) and 0 < divisor < math.inf):
            raise ValueError(f"the divisor must be a finite number > 0, got {divisor!r}")
        #: What the clipped sum (and its noise) is divided by: public (see the class docstring).
        self.expected_batch_size = (
            float(divisor) if divisor is not None else self.sample_rate * int(shard_size)
        )
        self.randomness = randomness if randomness is not None else Randomness.os_entropy()
        self.engine = engine
        self.accountant_name = accountant
        self.accountant = make_accountant(accountant)
        #: None, or ``extra_noise(step, k, p)``: float64 noise (units of the clipped sum) a
        #: mechanism adds to parameter k's noisy sum at `step` (`privacy.mechanisms.decor`).
        self.extra_noise = None
        #: None, or ``release_check(released) -> bool``, called with a step's noisy gradients
        #: before they are kept: False (it drew `randomness` a new key) makes the step pure noise
        #: under the new key, checked again (`privacy.releases`: a replay not bit for bit).
        self.release_check = None
        #: Private steps in the accountant's history that this run's own steps do not continue
        #: from: those an earlier process of this peer released that its checkpoint does not hold
        #: (`privacy.releases`). They count in the epsilon, not in the noise's step label.
        self.earlier_releases = 0
        self._noise_label = (-1, 0)  # (step, draws so far in that step) of the last noise draw
        self.module: Optional[nn.Module] = None

    # ---- set-up -----------------------------------------------------------------------------

    validate_model = staticmethod(validate_model)

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` wrapped to record what per-example clipping needs (see `GRAD_SAMPLE_ENGINES`).

        ``loss_reduction="mean"``: the trainer keeps its mean loss, the engine rescales per
        example. Wrapping is done once; wrapping the already wrapped model again returns it.
        Either wrapper names the parameters ``_module.<name>``, so checkpoints are the same.
        """
        grad_sample = import_opacus("opacus.grad_sample")
        if isinstance(model, (grad_sample.AbstractGradSampleModule, PerSampleModule)):
            if model is not self.module:
                raise ValueError(
                    "this model is already wrapped by another DPSGD: give each peer "
                    "its own unwrapped model"
                )
            return model
        if self.module is not None:
            raise ValueError("this DPSGD already wraps a model: create one DPSGD per peer model")
        validate_model(model, fix=False)
        engine = self.engine if self.engine != "auto" else _auto_engine(model)
        if engine in ("ghost", "vmap"):
            self.module = PerSampleModule(model, engine, loss_reduction="mean")
        elif engine == "hooks":
            register_layer_norm_sampler()  # a LayerNorm without bias, which Opacus' fails on
            self.module = grad_sample.GradSampleModule(
                model, batch_first=True, loss_reduction="mean", strict=True
            )
        else:
            self.module = grad_sample.wrap_model(
                model, engine, batch_first=True, loss_reduction="mean"
            )
        return self.module

    # ---- after backward ---------------------------------------------------------------------

    def per_example_gradients(self, model: nn.Module, batch_size: int) -> list[torch.Tensor]:
        """Each trainable parameter's per-example gradients, shape ``(batch_size, *p.shape)``.

        What the engine recorded during the last backward, for the examples' own (not averaged)
        losses; zeros for a parameter the forward did not use.
        """
        if isinstance(model, PerSampleModule):
            return model.per_example_gradients(batch_size)
        gradients = []
        for p in (p for p in model.parameters() if p.requires_grad):
            sample = getattr(p, "grad_sample", None)
            if isinstance(sample, list):
                raise ValueError(
                    "privatize found gradients of several forward/backward passes: "
                    "call it after every backward (Poisson batches do not accumulate)"
                )
            if sample is None:
                sample = torch.zeros((batch_size, *p.shape), dtype=p.dtype, device=p.device)
            if sample.shape[0] != batch_size:
                raise ValueError(
                    f"privatize was told the batch has {batch_size} examples but the "
                    f"per-example gradients hold {sample.shape[0]}: pass len(batch)"
                )
            gradients.append(sample)
        return gradients

    def clipped_sum(
        self, model: nn.Module, batch_size: int, divisor: float = 1.0
    ) -> list[torch.Tensor]:
        """Per trainable parameter, the sum over the batch of the clipped per-example gradients,
        divided by ``divisor`` (folded into the per-example clip factors).

        The ghost and vmap engines compute it without keeping per-example gradients of the
        Linear and Conv1d layers beyond the norms (`per_sample.py`); Opacus' engines from the
        per-example gradients they recorded.
        """
        if isinstance(model, PerSampleModule):
            return model.clipped_sum(self.max_grad_norm, batch_size, _NORM_EPS, divisor)
        gradients = self.per_example_gradients(model, batch_size)
        factor = self.clip_factors(gradients) / divisor
        summed = [torch.einsum("i,i...->...", factor.to(g.dtype), g) for g in gradients]
        for p in model.parameters():
            p.grad_sample = None
        return summed

    def clip_factors(self, gradients: list[torch.Tensor]) -> torch.Tensor:
        """Per example, min(1, C / (norm + 1e-6)); norm over all trainable parameters together."""
        batch_size = gradients[0].shape[0]
        norms = torch.stack(
            [g.reshape(batch_size, -1).norm(2, dim=1) for g in gradients], dim=1
        ).norm(2, dim=1)
        return (self.max_grad_norm / (norms + _NORM_EPS)).clamp(max=1.0)

    def _noise(self, n: int) -> Optional[torch.Tensor]:
        """``n`` draws of N(0, 1) (float64, CPU) of this step's noise stream; None for sigma = 0.

        The k-th call within step t (t = `own_steps`) reads the label
        (NOISE_STREAM, t, k), so the noise of a step is a function of the key and t alone;
        `privatize` makes one call per step, for all parameters in the model's order.
        Float64 is Box-Muller's precision (see `Randomness.normals`); the caller adds it to the
        gradient before rounding to the parameter's dtype.
        """
        step = self.own_steps
        draw = self._noise_label[1] if self._noise_label[0] == step else 0
        self._noise_label = (step, draw + 1)
        if self.noise_multiplier == 0:  # before multiplying: 0 * C is NaN for C = inf
            return None
        return self.randomness.normals(NOISE_STREAM, step, draw, n=n)

    def _noisy(self, params: list, means: list) -> list:
        """Per parameter ``mean + (sigma C / B) z`` in float64, rounded to the parameter's dtype,
        ``z`` this step's noise (`_noise`) in the parameters' order, ``B`` the divisor (by
        default the expected batch)."""
        noise = self._noise(sum(p.numel() for p in params))
        if noise is None:
            return [m.to(p.dtype) for p, m in zip(params, means)]
        scale = self.noise_multiplier * self.max_grad_norm / self.expected_batch_size
        dtype, device = params[0].dtype, params[0].device
        if all(p.dtype == dtype and p.device == device for p in params):  # one flat product
            flat = (
                torch.cat([m.reshape(-1) for m in means])
                if len(means) > 1
                else means[0].reshape(-1)
            )
            total = torch.add(flat, noise.to(device), alpha=scale).to(dtype)
            return [
                t.view(p.shape)
                for t, p in zip(torch.split(total, [p.numel() for p in params]), params)
            ]
        out, start = [], 0
        for p, m in zip(params, means):
            part = noise[start : start + p.numel()].to(p.device).view(p.shape)
            out.append(torch.add(m, part, alpha=scale).to(p.dtype))
            start += p.numel()
        return out

    def privatize(self, model: nn.Module, batch_size_actual: int) -> None:
        """Replace every trainable ``p.grad`` of ``model`` by its private version; step accounting.

        Call after ``loss.backward()`` and before ``optimizer.step()``. For an empty Poisson batch
        skip forward and backward and call this with 0: the gradient is then pure noise divided
        by the divisor (by default the expected batch size), and the step is accounted for like
        any other.
        """
        if (
            isinstance(batch_size_actual, bool)
            or int(batch_size_actual) != batch_size_actual
            or batch_size_actual < 0
        ):
            raise ValueError(
                f"batch_size_actual must be an integer >= 0, got {batch_size_actual!r}"
            )
        batch_size = int(batch_size_actual)
        if isinstance(model, PerSampleModule):  # the list its clipped sum is in (no module walk)
            params = model.trainable
        else:
            params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError(
                "differential privacy needs a model with trainable parameters; this one has none"
            )
        with torch.no_grad():
            if batch_size == 0:
                means = [torch.zeros_like(p) for p in params]
                if isinstance(model, PerSampleModule):
                    model.clear()
            else:  # the clipped sum divided by the divisor
                means = self.clipped_sum(model, batch_size, divisor=self.expected_batch_size)
            released = self._noisy(params, self._with_extra(params, means))
            if self.release_check is not None and not self.release_check(released):
                self._noise_label = (-1, 0)  # the new key's first draw of this step
                zeros = [torch.zeros_like(p) for p in params]
                released = self._noisy(params, self._with_extra(params, zeros))
                self.release_check(released)
            for p, grad in zip(params, released):
                p.grad = grad
        self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)

    def _with_extra(self, params: list, means: list) -> list:
        """`means` with a mechanism's own noise of this step added (DECOR's pairs'), if any."""
        if self.extra_noise is None:
            return means
        step = self.own_steps
        return [
            m + self.extra_noise(step, k, p) / self.expected_batch_size
            for k, (p, m) in enumerate(zip(params, means))
        ]

    # ---- evaluation -------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Private steps taken so far (what the accountant has composed)."""
        return sum(int(entry[2]) for entry in self.accountant.history)

    @property
    def own_steps(self) -> int:
        """This run's private steps so far, the label of the next step's noise: `steps` less the
        `earlier_releases`, so that it is the same on every peer (DECOR's pairs draw alike)."""
        return self.steps - self.earlier_releases

    def epsilon(self, delta: float) -> float:
        """The epsilon this peer has spent so far at ``delta``."""
        return epsilon(self.accountant, delta)

    # ---- checkpoint -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Accountant history and the randomness' state, as plain numbers, strings and tensors.

        Survives ``torch.save`` / ``torch.load(weights_only=True)``. The noise stream is counter
        based (the step count is the history's, less ``earlier_releases``, kept where there are
        some), so the randomness' state is its kind and, for a run-directory key only, the key
        (`Randomness.state_dict`): an OS-entropy key is never written anywhere.
        """
        state = {
            "accountant": self.accountant_name,
            "history": [[float(s), float(q), int(n)] for s, q, n in self.accountant.history],
            "randomness": self.randomness.state_dict(),
        }
        if self.earlier_releases:
            state["earlier_releases"] = int(self.earlier_releases)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict()``: same epsilon so far, same noise from here on."""
        name = state.get("accountant")
        if name != self.accountant_name:
            raise ValueError(
                f"the checkpoint's accountant is {name!r} but this run uses "
                f"{self.accountant_name!r}: resume with dp_accountant: {name}"
            )
        try:
            history = [(float(s), float(q), int(n)) for s, q, n in state["history"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                "the checkpoint's privacy state has no valid accountant history "
                "(expected a list of [sigma, sample_rate, steps])"
            ) from None
        if not isinstance(state.get("randomness"), dict):
            raise ValueError(
                "the checkpoint's privacy state has no DP randomness (it was written "
                "by an older version, whose noise was public): start a new run"
            )
        self.randomness.load_state_dict(state["randomness"])
        self.accountant.history = history
        self.earlier_releases = int(state.get("earlier_releases", 0))
