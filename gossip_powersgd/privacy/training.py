"""Differential privacy in a training run: the `DifferentialPrivacy` hook the trainer adds.

The trainer appends this hook when the config sets ``dp_noise_multiplier`` or
``dp_target_epsilon`` (``privacy_hook``). Per peer it:

* checks the model (Opacus must compute per-example gradients; ``dp_fix_model`` swaps what it
  cannot) and wraps it to record them;
* replaces the batches by Poisson sampling of the peer's own shard at q = batch_size / shard size;
* after every backward, clips each example's gradient to C and adds N(0, (sigma C)^2) to the
  peer's own sum (``DPSGD.privatize``). This runs before any gradient averaging (PowerSGD) and
  before the optimizer step, so every message a peer sends afterwards, whatever the algorithm, is
  post-processing of already private values;
* reports its epsilon after every evaluation and in the summary; checkpoints the accountant and the
  noise generator.

Peers agree on what they need from each other (shard sizes, for the default delta and the sigma of
a target epsilon) through scalar collectives only; no sample ever leaves its peer.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional

import torch

from gossip_powersgd.privacy.accounting import default_delta, noise_for_target
from gossip_powersgd.privacy.dpsgd import DPSGD, dp_enabled, validate_dp_options, validate_model
from gossip_powersgd.privacy.sampling import PoissonBatches, poisson_rate
from gossip_powersgd.training.hooks import SetupContext, TrainingHooks

__all__ = ["DifferentialPrivacy", "privacy_hook", "validate_privacy_config", "summary_rows",
           "check_noise_scale"]


def validate_privacy_config(config) -> None:
    """One-line ValueError for the first bad ``dp_*`` key of a `TrainConfig`; None when fine."""
    validate_dp_options(noise_multiplier=config.dp_noise_multiplier,
                        max_grad_norm=config.dp_max_grad_norm, delta=config.dp_delta,
                        target_epsilon=config.dp_target_epsilon, accountant=config.dp_accountant)


def check_noise_scale(sigma: float, batch: int, steps: int, peers: int,
                      target_epsilon: Optional[float] = None) -> None:
    """Refuse a noise multiplier with which nothing can be learned; one line naming the bound.

    Along any direction, the clipped gradients of all ``peers`` over all ``steps`` sum to at most
    steps x peers x batch x C (each example's gradient has norm <= C, ``batch`` is the expected
    batch), while their noise sums to a Gaussian of std sqrt(steps x peers) x sigma x C. For
    sigma > batch x sqrt(steps x peers) the noise of the whole run exceeds the largest signal it
    could carry, even averaged over every peer: the run cannot learn, and would only end in a
    divergence blamed on the learning rate.
    """
    bound = batch * math.sqrt(steps * peers)
    if sigma <= bound:
        return
    what = (f"dp_target_epsilon={target_epsilon:g} needs dp_noise_multiplier {sigma:.4g}, which is"
            if target_epsilon is not None else f"dp_noise_multiplier={sigma:g} is")
    fix = "raise dp_target_epsilon" if target_epsilon is not None else "lower dp_noise_multiplier"
    raise ValueError(f"{what} too large to learn anything: over the run's {steps} steps on {peers} "
                     f"peers its noise exceeds the largest signal the clipped gradients can carry "
                     f"(sigma must be at most batch x sqrt(steps x peers) = {bound:.4g}, batch "
                     f"{batch} the expected batch size); {fix} (or train longer)")


def privacy_hook(config) -> Optional["DifferentialPrivacy"]:
    """The hook a run with ``config`` needs: a `DifferentialPrivacy`, or None when DP is off."""
    if not dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon):
        return None
    return DifferentialPrivacy()


def _gather_floats(comm, value: float) -> List[float]:
    """Every peer's ``value``, in rank order (one metric all-reduce of a vector of scalars)."""
    values = torch.zeros(comm.size, dtype=torch.float64)
    values[comm.rank] = float(value)
    comm.allreduce_(values, op="sum", metric=True)
    return [float(v) for v in values]


class DifferentialPrivacy(TrainingHooks):
    """Per-peer DP-SGD for `train`, configured by the run's ``dp_*`` keys (see the module doc)."""

    name = "differential_privacy"

    def __init__(self):
        self.dp: Optional[DPSGD] = None
        self.batches: Optional[PoissonBatches] = None
        self.model: Optional[torch.nn.Module] = None
        self.comm = None
        self.delta = math.nan
        self.sample_rates: List[float] = []

    # ---- set-up -----------------------------------------------------------------------------

    def setup(self, context: SetupContext) -> None:
        """Fix or check the model, wrap it, sample Poisson batches, pick sigma and delta."""
        from gossip_powersgd.training.setup import collectively, make_optimizer

        config, comm = context.config, context.comm
        self.comm = comm
        # The shard sizes first: the collective runs on every peer before anything can fail on one.
        shard = len(context.batches.x)
        sizes = [int(s) for s in _gather_floats(comm, shard)]
        collectively(comm, validate_privacy_config, config)
        self.sample_rates = collectively(comm, lambda: [poisson_rate(config.batch_size, s)
                                                        for s in sizes])
        self.delta = float(config.dp_delta) if config.dp_delta is not None \
            else default_delta(max(sizes))
        steps = config.epochs * context.steps_per_epoch
        if config.dp_target_epsilon is not None:
            sigma = collectively(comm, noise_for_target, config.dp_target_epsilon, self.delta,
                                 self.sample_rates, steps, config.dp_accountant)
        else:
            sigma = float(config.dp_noise_multiplier)
        collectively(comm, check_noise_scale, sigma, config.batch_size, steps, comm.size,
                     config.dp_target_epsilon)
        model = collectively(comm, validate_model, context.model, config.dp_fix_model)
        if model is not context.model:
            # The fix swapped layers, so the parameters are new objects: the optimizer and the
            # algorithm must be built again on them (neither has stepped yet).
            from gossip_powersgd.algorithms import make_algorithm

            model = model.to(context.device)
            context.optimizer = make_optimizer(config, model.parameters())
            context.algorithm = make_algorithm(config.algorithm, model.named_parameters(), comm)
        rank = comm.rank
        self.dp = DPSGD(sigma, config.dp_max_grad_norm, self.sample_rates[rank], shard,
                        accountant=config.dp_accountant, seed=config.seed, rank=rank,
                        secure=config.dp_secure_noise)
        # Opacus' per-example hooks on a first layer whose input needs no gradient make torch
        # warn at every backward; the gradients are right (Opacus' own tests run this way).
        warnings.filterwarnings("ignore", message="Full backward hook is firing",
                                category=UserWarning)
        self.model = context.model = self.dp.wrap(model)
        self.batches = context.batches = PoissonBatches(
            context.batches.x, context.batches.y, self.sample_rates[rank], seed=config.seed,
            rank=rank)

    # ---- every step -------------------------------------------------------------------------

    def after_backward(self, step: int) -> None:
        """Clip and noise this peer's gradient (before any averaging and the optimizer step)."""
        self.dp.privatize(self.model, self.batches.last_batch_size)

    # ---- reporting --------------------------------------------------------------------------

    def divergence_hint(self) -> str:
        """What a divergence message adds when DP is on: the noise, a likely cause, in numbers."""
        dp = self.dp
        if dp is None or dp.noise_multiplier == 0:
            return ""
        relative = dp.noise_multiplier / dp.expected_batch_size
        return (f"; DP is on and its noise is a likely cause: its std sigma x C / B is "
                f"{relative * dp.max_grad_norm:.3g} on each coordinate of the gradient, "
                f"{relative:.3g} x the clipping norm C = {dp.max_grad_norm:g} that bounds the "
                f"whole clipped gradient (B = {dp.expected_batch_size:.4g}, the expected batch): "
                "lower dp_noise_multiplier (or raise dp_target_epsilon)")

    def epsilon(self) -> float:
        """This peer's epsilon so far at the run's delta (infinite without noise)."""
        if self.dp.noise_multiplier == 0:
            return math.inf
        return self.dp.epsilon(self.delta)

    def on_evaluation(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """This peer's epsilon and the worst peer's (collective: every peer evaluates together)."""
        mine = self.epsilon()
        worst = torch.tensor([mine], dtype=torch.float64)
        self.comm.allreduce_(worst, op="max", metric=True)
        return {"epsilon": _json_number(mine), "epsilon_max": _json_number(float(worst[0])),
                "delta": self.delta}

    def summary_fields(self) -> Dict[str, Any]:
        """What summary.json adds for a private run (collective)."""
        epsilons = _gather_floats(self.comm, self.epsilon())
        return {"epsilon": [_json_number(e) for e in epsilons], "delta": self.delta,
                "noise_multiplier": self.dp.noise_multiplier,
                "max_grad_norm": _json_number(self.dp.max_grad_norm),
                "sample_rate": list(self.sample_rates), "dp_accountant": self.dp.accountant_name,
                "dp_secure_noise": self.dp.secure}

    # ---- checkpoint -------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The accountant's history and the noise generator (Poisson batches are the loop's)."""
        return self.dp.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.dp.load_state_dict(state)


def _json_number(value: float):
    """``value``, or the string "inf" (JSON has no infinity; sigma = 0 spends an infinite epsilon)."""
    return value if math.isfinite(value) else "inf"


def summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    """The summary table's privacy rows: differential privacy's, then the recorded views'
    (`views.observer_summary_rows`); none for a run with neither."""
    from gossip_powersgd.privacy.views import observer_summary_rows

    if "noise_multiplier" not in summary:
        return observer_summary_rows(summary)
    epsilons = [math.inf if e == "inf" else float(e) for e in summary["epsilon"]]
    rates = summary["sample_rate"]
    return [
        ("DP noise multiplier σ / clip norm C", f"{summary['noise_multiplier']:.4g} / "
                                                f"{summary['max_grad_norm']}"),
        ("DP δ", f"{summary['delta']:g}"),
        ("DP sampling rate q [min, max]", f"[{min(rates):.4g}, {max(rates):.4g}]"),
        (f"DP ε at δ ({summary['dp_accountant']}) [min, max]",
         f"[{min(epsilons):.4g}, {max(epsilons):.4g}]"),
    ] + observer_summary_rows(summary)
