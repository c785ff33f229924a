"""Differential privacy in a training run: the `DifferentialPrivacy` hook the trainer adds.

The trainer appends this hook when the config sets ``dp_noise_multiplier`` or
``dp_target_epsilon`` (``privacy_hook``; the keys and their checks are `dp_config`'s). Per peer it:

* checks the model (Opacus must compute per-example gradients; recurrent layers are swapped for
  their Opacus twins, ``dp_fix_model`` swaps what else it cannot take: `model_check`) and wraps it
  to record them;
* replaces the batches by Poisson sampling of the peer's own shard at its rate q
  (batch_size / shard size, capped: see below);
* after every backward, clips each example's gradient to C, adds N(0, (sigma C)^2) to the peer's
  own sum and divides by batch_size (``DPSGD.privatize``). This runs before any gradient
  averaging (PowerSGD) and before the optimizer step, so every message a peer sends afterwards,
  whatever the algorithm, is post-processing of already private values;
* draws its noise and its Poisson masks from its own secret keystream (`seeds.Randomness`, the
  ``dp_secret`` key: fresh OS entropy, or a key kept in its own folder of the run directory and
  in its checkpoints; rank 0 warns that a shared run directory shares it);
* records its epsilon after every evaluation in its own metrics file, and at the end writes its
  own figures (shard size, rate, sigma, epsilons, each with its label) to its own
  ``peers/rank-K.json``; checkpoints the accountant and the randomness' state;
* with a secret key and a run directory, records every private step before anything of it is sent
  (`releases`), so that the steps an earlier attempt released and the checkpoint resumed from does
  not hold (sent after it, or by attempts set aside) are in its epsilon; with ``run_dir``, what
  each step released too, so that a step a resume takes again is sent only if bit for bit the same.

What crosses to other peers: nothing computed from a peer's data but its messages. The scale of a
peer's noise (sigma C / batch_size per coordinate) is visible in them, so it comes from public
quantities only: with ``dp_target_epsilon`` one sigma is solved for the public rate
batch_size / dp_public_shard_size (`dp_config.public_rate`), and a peer whose own rate is above
it samples at that rate; a peer whose shard is smaller than the batch samples at rate 1. Its
shard size, rate, epsilon and label histogram are not gathered unless
``release_peer_statistics: true``; then the summary lists them for every peer, and the epsilon is
replace-one's (a public size makes add/remove's assumption false; `accounting`). The default delta
comes from the public total number of training samples, not from the shard sizes.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from gossip_powersgd.launch import collectively
from gossip_powersgd.privacy.accounting import (
    ADD_REMOVE,
    REPLACE_ONE,
    default_delta,
    epsilon_label,
    noise_for_target,
    pld_epsilon,
)
from gossip_powersgd.privacy.dp_config import (
    DP_KEYS,
    RANDOMNESS_NOTES,
    RUN_DIR_WARNING,
    check_noise_scale,
    keeps_peer_statistics_private,
    public_rate,
    randomness_kind,
    validate_dp_config,
    validate_privacy_config,
)
from gossip_powersgd.privacy.dp_report import (
    ABSENT_NOTE,
    NETWORK_NOTE,
    TUNING_NOTE,
    dp_summary_rows,
    eval_text,
    from_json_number,
    json_number,
    peers_named,
)
from gossip_powersgd.privacy.dpsgd import DPSGD, dp_enabled, validate_model
from gossip_powersgd.privacy.releases import ReleaseRecord, count_earlier
from gossip_powersgd.privacy.sampling import PoissonBatches, poisson_rate
from gossip_powersgd.privacy.seeds import make_randomness
from gossip_powersgd.privacy.subspace import subspace_hook
from gossip_powersgd.training.features import Feature, register
from gossip_powersgd.training.hooks import SetupContext, TrainingHooks
from gossip_powersgd.utils import warn

if TYPE_CHECKING:
    from ..comm.base import Comm

__all__ = [
    "DifferentialPrivacy",
    "privacy_hook",
    "validate_privacy_config",
    "summary_rows",
    "dp_summary_rows",
    "check_noise_scale",
    "keeps_peer_statistics_private",
    "own_rate",
    "DP_FEATURE",
]


def privacy_hook(config) -> Optional["DifferentialPrivacy"]:
    """The hook a run with ``config`` needs: a `DifferentialPrivacy`, or None when DP is off."""
    if not dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon):
        return None
    return DifferentialPrivacy()


def own_rate(batch_size: int, shard_size: int, cap: float) -> float:
    """A peer's Poisson rate with private sizes: min(batch_size / shard size, cap), cap <= 1 public.

    No error names the size: a shard smaller than the batch samples at rate 1 (all its records;
    the sum is still divided by batch_size); an empty one is refused without a number."""
    if int(shard_size) < 1:
        raise ValueError(
            "a peer's shard holds no training sample: every peer needs at least one (the "
            "shard sizes are private, so no size is named)"
        )
    return min(batch_size / int(shard_size), float(cap))


def _gather_floats(comm: Comm, value: float) -> List[float]:
    """Every peer's ``value``, in rank order (one metric all-reduce of a vector of scalars)."""
    values = torch.zeros(comm.size, dtype=torch.float64)
    values[comm.rank] = float(value)
    comm.allreduce_(values, op="sum", metric=True)
    return [float(v) for v in values]


def _gather_members(comm: Comm, value: float) -> List[Optional[float]]:
    """Every peer's ``value`` in rank order, None for a peer that takes no part in the collective
    (under ``on_peer_loss: continue``, one that is not a member at the end: its figures are in its
    own file only; a zero in its place would read as epsilon 0). One metric all-reduce."""
    values = torch.zeros(2 * comm.size, dtype=torch.float64)
    values[comm.rank], values[comm.size + comm.rank] = float(value), 1.0
    comm.allreduce_(values, op="sum", metric=True)
    present = values[comm.size :].tolist()
    return [float(v) if present[k] else None for k, v in enumerate(values[: comm.size].tolist())]


class DifferentialPrivacy(TrainingHooks):
    """Per-peer DP-SGD for `train`, configured by the run's ``dp_*`` keys (see the module doc)."""

    name = "differential_privacy"

    def __init__(self):
        self.dp: Optional[DPSGD] = None
        self.batches: Optional[PoissonBatches] = None
        self.model: Optional[torch.nn.Module] = None
        self.comm = None
        self.delta = math.nan
        self.release = False
        self.sample_rates: List[float] = []  # every peer's, with release_peer_statistics only
        self._figures: Optional[Dict[str, Any]] = None
        self.mechanism = "local"
        self.exchanged_subspace = False  # dp_exchanged_subspace (`privacy/subspace.py`)
        self.epsilon_note: Optional[str] = None  # what a muffliato run's epsilon means
        self.record: Optional[ReleaseRecord] = None  # secret noise in a run directory: `releases`

    # ---- set-up -----------------------------------------------------------------------------

    def _rate_and_sigma(self, context: SetupContext, shard: int) -> tuple:
        """(this peer's rate, sigma), delta set on the way (collective)."""
        config, comm = context.config, context.comm
        steps = config.epochs * context.steps_per_epoch
        target = config.dp_target_epsilon
        if self.release:
            # The shard sizes first: the collective runs on every peer before anything can fail.
            sizes = [int(s) for s in _gather_floats(comm, shard)]
        collectively(comm, validate_privacy_config, config)
        if self.release:
            self.sample_rates = collectively(
                comm, lambda: [poisson_rate(config.batch_size, s) for s in sizes]
            )
            rate, largest = self.sample_rates[comm.rank], max(sizes)
        else:
            cap = 1.0 if target is None else public_rate(config, context.train_size, comm.size)
            rate = collectively(comm, own_rate, config.batch_size, shard, cap)
            largest = context.train_size  # public; set-up checked it is >= every shard's size
        self.delta = (
            float(config.dp_delta) if config.dp_delta is not None else default_delta(largest)
        )
        if target is None:
            sigma = float(config.dp_noise_multiplier)
        else:  # public inputs only: every peer solves for the same sigma
            rates = self.sample_rates if self.release else [cap]
            sigma = collectively(
                comm,
                noise_for_target,
                target,
                self.delta,
                rates,
                steps,
                config.dp_accountant,
                replace_one=self.release,
            )
        collectively(comm, check_noise_scale, sigma, config.batch_size, steps, comm.size, target)
        return rate, sigma

    def setup(self, context: SetupContext) -> None:
        """Fix or check the model, wrap it, sample Poisson batches, pick sigma, delta and the key."""
        config, comm = context.config, context.comm
        self.comm, self.release = comm, bool(config.release_peer_statistics)
        shard, rank = len(context.batches.x), comm.rank
        rate, sigma = self._rate_and_sigma(context, shard)
        model = collectively(comm, validate_model, context.model, config.dp_fix_model)
        if model is not context.model:
            # Layers were swapped, so the parameters are new objects: the optimizer and the
            # algorithm are built again on them (`SetupContext.replace_model`).
            context.replace_model(model)
        model = context.model
        # Last, so that a run refused above leaves no key file behind.
        kind = randomness_kind(config)
        randomness = collectively(
            comm, make_randomness, kind, seed=config.seed, rank=rank, run_dir=config.out_dir
        )
        if kind == "run_dir" and rank == 0:
            print(RUN_DIR_WARNING, file=sys.stderr, flush=True)
        self.dp = DPSGD(
            sigma,
            config.dp_max_grad_norm,
            rate,
            shard,
            accountant=config.dp_accountant,
            randomness=randomness,
            divisor=config.batch_size,
        )
        if kind != "public" and config.out_dir is not None:
            self.record = ReleaseRecord(config.out_dir, rank)
            self.record.watch(self.dp)  # run_dir: a replay must be bit for bit, or is not sent
            if not context.resuming:  # after attempts set aside (resume: auto)
                earlier = collectively(comm, self.record.earlier)
                count_earlier(self.dp, earlier, rank, "by earlier attempts in this run directory")
        from gossip_powersgd.privacy.mechanisms import attach_mechanism, mechanism_of

        self.mechanism = config.dp_mechanism
        note, warning = mechanism_of(config).epsilon_note(config)
        if note is not None:
            self.epsilon_note = note
        if warning and rank == 0:
            warn(warning)
        self.exchanged_subspace = bool(config.dp_exchanged_subspace)
        collectively(
            comm,
            attach_mechanism,
            config,
            comm,
            self.dp,
            context.algorithm,
            randomness,
            resume=context.resuming,
        )
        # Opacus' per-example hooks on a first layer whose input needs no gradient make torch
        # warn at every backward; the gradients are right (Opacus' own tests run this way).
        warnings.filterwarnings(
            "ignore", message="Full backward hook is firing", category=UserWarning
        )
        self.model = context.model = self.dp.wrap(model)
        self.batches = context.batches = PoissonBatches(
            context.batches.x,
            context.batches.y,
            rate,
            seed=config.seed,
            rank=rank,
            randomness=randomness,
        )

    # ---- every step -------------------------------------------------------------------------

    def after_backward(self, step: int) -> None:
        """Clip and noise this peer's gradient (before any averaging and the optimizer step)."""
        self.dp.privatize(self.model, self.batches.last_batch_size)
        if self.record is not None:  # before anything of this step leaves the peer
            self.record.released(self.dp)

    # ---- reporting --------------------------------------------------------------------------

    def divergence_hint(self) -> str:
        """What a divergence message adds when DP is on: the noise, a likely cause, in numbers."""
        dp = self.dp
        if dp is None or dp.noise_multiplier == 0:
            return ""
        relative = dp.noise_multiplier / dp.expected_batch_size
        return (
            f"; DP is on and its noise is a likely cause: its std sigma x C / B is "
            f"{relative * dp.max_grad_norm:.3g} on each coordinate of the gradient, "
            f"{relative:.3g} x the clipping norm C = {dp.max_grad_norm:g} that bounds the "
            f"whole clipped gradient (B = {dp.expected_batch_size:.4g}, the batch size): "
            "lower dp_noise_multiplier (or raise dp_target_epsilon)"
        )

    @property
    def adjacency(self) -> str:
        """The relation this run's epsilon is for: replace-one where the sizes are released."""
        return REPLACE_ONE if self.release else ADD_REMOVE

    def _history(self) -> list:
        return [tuple(entry) for entry in self.dp.accountant.history]

    def epsilon(self) -> float:
        """This peer's epsilon so far at the run's delta, under `adjacency` (infinite without
        noise): the run's accountant (add/remove), or dp-accounting's PLD (replace-one)."""
        if self.dp.noise_multiplier == 0:
            return math.inf
        if self.release:
            return pld_epsilon(self._history(), self.delta, replace_one=True)
        return self.dp.epsilon(self.delta)

    def _label(self) -> str:
        return epsilon_label(self.adjacency, "pld" if self.release else self.dp.accountant_name)

    def on_evaluation(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """This peer's epsilon (its own metrics file); the worst peer's too where the peers'
        figures are released (then collective: every peer evaluates together)."""
        mine = self.epsilon()
        extra = {"epsilon": json_number(mine), "epsilon_bound": self._label(), "delta": self.delta}
        if self.release:
            worst = torch.tensor([mine], dtype=torch.float64)
            self.comm.allreduce_(worst, op="max", metric=True)
            extra["epsilon_max"] = json_number(float(worst[0]))
        return extra

    def own_figures(self) -> Dict[str, Any]:
        """This peer's privacy figures (computed once, at the end), each epsilon with its label:
        ``epsilon`` is the guarantee (`epsilon`); beside it add/remove's by the run's accountant
        where the sizes are released, and add/remove's by dp-accounting's PLD."""
        if self._figures is None:
            history, name = self._history(), self.dp.accountant_name
            figures = {
                "sample_rate": self.dp.sample_rate,
                "noise_multiplier": self.dp.noise_multiplier,
                "steps": self.dp.steps,
                "delta": self.delta,
                "epsilon": json_number(self.epsilon()),
                "epsilon_label": self._label(),
                "dp_accountant": name,
                "dp_adjacency": self.adjacency,
            }
            if self.dp.earlier_releases:  # in steps: released by an earlier process (`releases`)
                figures["steps_released_before_restart"] = self.dp.earlier_releases
            if self.release:
                figures["epsilon_add_remove"] = json_number(self.dp.epsilon(self.delta))
                figures["epsilon_add_remove_label"] = (
                    epsilon_label(ADD_REMOVE, name) + ", not the guarantee: the sizes are released"
                )
            figures["epsilon_pld"] = json_number(pld_epsilon(history, self.delta))
            figures["epsilon_pld_label"] = epsilon_label(ADD_REMOVE, "pld") + (
                ", not the guarantee: the sizes are released" if self.release else ""
            )
            self._figures = figures
        return self._figures

    def peer_fields(self) -> Dict[str, Any]:
        """What this peer adds to its own ``peers/rank-K.json`` (not collective)."""
        kind = self.dp.randomness.kind
        return {
            **self.own_figures(),
            "dp_randomness": kind,
            "dp_randomness_note": RANDOMNESS_NOTES[kind],
        }

    def summary_fields(self) -> Dict[str, Any]:
        """What summary.json adds for a private run (collective when the figures are released).

        Public figures only: delta (from the config or the public total size), sigma (from
        public quantities), C, the accountant, the adjacency, where the randomness comes from,
        what the budget leaves out (tuning). Every peer's epsilons and sampling rate only with
        ``release_peer_statistics``: null for a peer that is not a member at the end (churn; its
        own file has them), which ``dp_peers_absent`` names."""
        kind = self.dp.randomness.kind
        fields = {
            "delta": self.delta,
            "max_grad_norm": json_number(self.dp.max_grad_norm),
            "dp_mechanism": self.mechanism,
            "dp_exchanged_subspace": self.exchanged_subspace,
            "dp_accountant": self.dp.accountant_name,
            "dp_adjacency": self.adjacency,
            "dp_randomness": kind,
            "dp_randomness_note": RANDOMNESS_NOTES[kind],
            "noise_multiplier": self.dp.noise_multiplier,
            "dp_tuning": TUNING_NOTE,
        }
        from gossip_powersgd.privacy.mechanisms import MECHANISM_REGISTRY

        if MECHANISM_REGISTRY.get(self.mechanism).network_bound:
            fields["dp_network_bound"] = NETWORK_NOTE
        if self.epsilon_note:
            fields["dp_epsilon_note"] = self.epsilon_note
        mine = self.own_figures()
        if not self.release:
            fields["epsilon_per_peer"] = "in each peer's own peers/rank-K.json"
            return fields
        keys = ("epsilon", "epsilon_add_remove", "epsilon_pld")
        for key in (*keys, "sample_rate"):
            values = _gather_members(self.comm, from_json_number(mine[key]))
            fields[key] = [
                v if v is None or key == "sample_rate" else json_number(v) for v in values
            ]
        absent = [k for k, v in enumerate(fields["sample_rate"]) if v is None]
        if absent:
            fields["dp_peers_absent"] = ABSENT_NOTE.format(peers_named(absent))
        fields["epsilon_labels"] = {
            "epsilon": mine["epsilon_label"],
            "epsilon_add_remove": mine["epsilon_add_remove_label"],
            "epsilon_pld": mine["epsilon_pld_label"],
        }
        return fields

    # ---- checkpoint -------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The accountant's history and the noise generator (Poisson batches are the loop's)."""
        return self.dp.state_dict()

    def on_checkpoint(self) -> None:
        """Digests older than the checkpoints kept are pruned (an away file is none)."""
        if self.record is not None:
            self.record.checkpoint(self.dp)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The checkpoint's state, then what the release record adds (`ReleaseRecord.resume`:
        under ``os`` the steps released after it, under ``run_dir`` the digests of replays)."""
        self.dp.load_state_dict(state)
        if self.record is not None:
            self.record.resume(self.dp)


def summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    """The summary table's privacy rows: differential privacy's, then the recorded views'
    (`observing.observer_summary_rows`); none for a run with neither."""
    from gossip_powersgd.privacy.observing import observer_summary_rows

    return dp_summary_rows(summary) + observer_summary_rows(summary)


#: Differential privacy as a config-driven feature (`training/features.py`): the ``dp_*`` keys
#: (`dp_config.DP_KEYS`; also nested: ``dp: {noise_multiplier: 1.0, max_grad_norm: 1.0}``).
DP_FEATURE = register(
    Feature(
        name="dp",
        section="dp",
        keys=DP_KEYS,
        validate=validate_dp_config,
        hooks=lambda config: [
            h for h in (privacy_hook(config), subspace_hook(config)) if h is not None
        ],
        summary_rows=dp_summary_rows,
        eval_text=eval_text,
        private=lambda config: dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon),
    )
)
