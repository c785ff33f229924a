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
* draws its noise and its Poisson masks from its own secret keystream (`seeds.Randomness`, the
  ``dp_secret`` key: fresh OS entropy, or a key kept in its own run directory and checkpoint);
* reports its epsilon after every evaluation, and at the end writes its own figures (shard size,
  sampling rate, sigma, epsilon by the configured accountant and by dp-accounting's PLD) to its own
  ``peers/rank-K.json``; checkpoints the accountant and the randomness' state.

What crosses to other peers: nothing computed from a peer's data but its messages. Its shard
size, sampling rate, epsilon (a function of the rate) and label histogram are not gathered unless
``release_peer_statistics: true``; then the summary lists them for every peer, and epsilon under
replace-one adjacency too (a public size makes it the fitting relation). The default delta comes
from the public total number of training samples, not from the shard sizes. With
``dp_target_epsilon`` and private sizes each peer solves for its own sigma (its own rate): every
peer meets the target, but the scale of its noise, visible in its messages, then reflects its
shard size roughly; set ``dp_noise_multiplier`` (one public sigma) where that matters.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from gossip_powersgd.privacy.accounting import (
    ADD_REMOVE,
    REPLACE_ONE,
    default_delta,
    noise_for_target,
    pld_epsilon,
)
from gossip_powersgd.privacy.dpsgd import DPSGD, dp_enabled, validate_dp_options, validate_model
from gossip_powersgd.privacy.sampling import PoissonBatches, poisson_rate
from gossip_powersgd.privacy.seeds import make_randomness
from gossip_powersgd.utils import warn
from gossip_powersgd.privacy.subspace import subspace_hook
from gossip_powersgd.training.features import Feature, Key, peer_statistics_private, register
from gossip_powersgd.training.hooks import SetupContext, TrainingHooks

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
    "DP_FEATURE",
]


#: What each randomness kind means for the guarantee, in the words the summary uses.
RANDOMNESS_NOTES = {
    "os": "secret per peer: a fresh OS-entropy key, never written anywhere",
    "run_dir": "secret per peer: a key kept only in that peer's secrets/rank-K.key (mode 0600) "
    "and its checkpoint",
    "public": "PUBLIC (dp_public_randomness): noise and masks derive from the shared seed, so every "
    "peer can regenerate and subtract them; ε holds against outsiders only, not against "
    "the peers",
}

_SECRETS = ("os", "run_dir")


def randomness_kind(config) -> str:
    """The `seeds.RANDOMNESS_KINDS` entry a config asks for."""
    return "public" if config.dp_public_randomness else config.dp_secret


def keeps_peer_statistics_private(config) -> bool:
    """Whether each peer's shard size, label histogram and training loss stay on that peer.

    They are functions of its private data computed outside the DP mechanism, so under
    differential privacy, and under `partition: local` (where the data exists only on its peer),
    nothing gathers them to other peers, the summary or rank 0's output, unless the user sets
    `release_peer_statistics: true`.
    """
    return peer_statistics_private(config)


def validate_privacy_config(config) -> None:
    """One-line ValueError for the first bad ``dp_*`` key of a `TrainConfig`; None when fine."""
    if config.max_grad_norm is not None and dp_enabled(
        config.dp_noise_multiplier, config.dp_target_epsilon
    ):
        raise ValueError(
            "max_grad_norm clips plain training's gradient; under DP each sample's gradient is "
            "clipped by dp_max_grad_norm (the noise is calibrated to it): drop max_grad_norm"
        )
    validate_dp_options(
        noise_multiplier=config.dp_noise_multiplier,
        max_grad_norm=config.dp_max_grad_norm,
        delta=config.dp_delta,
        target_epsilon=config.dp_target_epsilon,
        accountant=config.dp_accountant,
    )
    total = config.public_train_size
    if total is not None and config.partition != "local":
        raise ValueError(
            f"bad value for 'public_train_size': {total!r} (it is for partition: "
            "local; other partitions split a dataset every peer loads, whose size is "
            "public)"
        )
    if total is None and config.partition == "local" and keeps_peer_statistics_private(config):
        raise ValueError(
            "bad value for 'public_train_size': None (partition: local needs the "
            "total number of training samples declared public to size an epoch: set "
            "public_train_size: N, or release_peer_statistics: true to let the peers "
            "all-reduce their shard sizes)"
        )
    if config.dp_secret not in _SECRETS:
        raise ValueError(
            f"dp_secret must be one of {', '.join(_SECRETS)}, got {config.dp_secret!r}"
        )
    if config.dp_secure_noise is False:
        raise ValueError(
            "dp_secure_noise: false (noise from the shared seed) is gone: the noise "
            "is secret per peer; for reproducible runs set dp_secret: run_dir (or "
            "dp_public_randomness: true, which every peer can undo)"
        )
    if config.dp_public_randomness and config.dp_secret == "run_dir":
        raise ValueError(
            "dp_public_randomness: true derives the noise from the shared seed, so a "
            "dp_secret: run_dir key would be unused: set only one of them"
        )
    from gossip_powersgd.privacy.mechanisms import validate_mechanism_config

    validate_mechanism_config(config)
    if (
        dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon)
        and randomness_kind(config) == "run_dir"
        and config.out_dir is None
    ):
        raise ValueError(
            "dp_secret: run_dir keeps each peer's key in its run directory: set "
            "out_dir, or use dp_secret: os"
        )


def _own_sigma(target: float, delta: float, rate: float, steps: int, accountant: str) -> float:
    """`noise_for_target` for this peer's own rate; its error names no rate (it would tell the
    other peers this peer's shard size)."""
    try:
        return noise_for_target(target, delta, [rate], steps, accountant)
    except ValueError:
        raise ValueError(
            f"dp_target_epsilon={target:g} is unreachable for at least one peer with "
            f"delta={delta:g} and {steps} steps: raise the target or delta, or lower "
            f"the batch size or the number of epochs"
        ) from None


def check_noise_scale(
    sigma: float, batch: int, steps: int, peers: int, target_epsilon: Optional[float] = None
) -> None:
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
    what = (
        f"dp_target_epsilon={target_epsilon:g} needs dp_noise_multiplier {sigma:.4g}, which is"
        if target_epsilon is not None
        else f"dp_noise_multiplier={sigma:g} is"
    )
    fix = "raise dp_target_epsilon" if target_epsilon is not None else "lower dp_noise_multiplier"
    raise ValueError(
        f"{what} too large to learn anything: over the run's {steps} steps on {peers} "
        f"peers its noise exceeds the largest signal the clipped gradients can carry "
        f"(sigma must be at most batch x sqrt(steps x peers) = {bound:.4g}, batch "
        f"{batch} the expected batch size); {fix} (or train longer)"
    )


def privacy_hook(config) -> Optional["DifferentialPrivacy"]:
    """The hook a run with ``config`` needs: a `DifferentialPrivacy`, or None when DP is off."""
    if not dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon):
        return None
    return DifferentialPrivacy()


def _gather_floats(comm: Comm, value: float) -> List[float]:
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
        self.release = False
        self.sigma_per_peer = False  # a target epsilon with private sizes: each peer its own sigma
        self.sample_rates: List[float] = []  # every peer's, with release_peer_statistics only
        self._figures: Optional[Dict[str, Any]] = None
        self.mechanism = "local"
        self.exchanged_subspace = False  # dp_exchanged_subspace (`privacy/subspace.py`)
        self.epsilon_note: Optional[str] = None  # what a muffliato run's epsilon means

    # ---- set-up -----------------------------------------------------------------------------

    def setup(self, context: SetupContext) -> None:
        """Fix or check the model, wrap it, sample Poisson batches, pick sigma, delta and the key."""
        from gossip_powersgd.training.setup import collectively, make_optimizer

        config, comm = context.config, context.comm
        self.comm, self.release = comm, bool(config.release_peer_statistics)
        shard, rank = len(context.batches.x), comm.rank
        steps = config.epochs * context.steps_per_epoch
        if self.release:
            # The shard sizes first: the collective runs on every peer before anything can fail.
            sizes = [int(s) for s in _gather_floats(comm, shard)]
        collectively(comm, validate_privacy_config, config)
        if self.release:
            self.sample_rates = collectively(
                comm, lambda: [poisson_rate(config.batch_size, s) for s in sizes]
            )
            rate, largest = self.sample_rates[rank], max(sizes)
        else:
            rate = collectively(comm, poisson_rate, config.batch_size, shard)
            largest = context.train_size  # public, and at least every shard's size
        self.delta = (
            float(config.dp_delta) if config.dp_delta is not None else default_delta(largest)
        )
        if config.dp_target_epsilon is not None and self.release:
            sigma = collectively(
                comm,
                noise_for_target,
                config.dp_target_epsilon,
                self.delta,
                self.sample_rates,
                steps,
                config.dp_accountant,
            )
        elif config.dp_target_epsilon is not None:
            self.sigma_per_peer = True
            sigma = collectively(
                comm,
                _own_sigma,
                config.dp_target_epsilon,
                self.delta,
                rate,
                steps,
                config.dp_accountant,
            )
        else:
            sigma = float(config.dp_noise_multiplier)
        collectively(
            comm,
            check_noise_scale,
            sigma,
            config.batch_size,
            steps,
            comm.size,
            config.dp_target_epsilon,
        )
        model = collectively(comm, validate_model, context.model, config.dp_fix_model)
        if model is not context.model:
            # The fix swapped layers, so the parameters are new objects: the optimizer and the
            # algorithm must be built again on them (neither has stepped yet).
            from gossip_powersgd.algorithms import make_algorithm

            model = model.to(context.device)
            context.optimizer = make_optimizer(config, model.parameters())
            context.algorithm = make_algorithm(config.algorithm, model.named_parameters(), comm)
        # Last, so that a run refused above leaves no key file behind.
        randomness = collectively(
            comm,
            make_randomness,
            randomness_kind(config),
            seed=config.seed,
            rank=rank,
            run_dir=config.out_dir,
        )
        self.dp = DPSGD(
            sigma,
            config.dp_max_grad_norm,
            rate,
            shard,
            accountant=config.dp_accountant,
            randomness=randomness,
        )
        from gossip_powersgd.privacy.mechanisms import attach_mechanism

        self.mechanism = config.dp_mechanism
        if self.mechanism == "muffliato":
            from gossip_powersgd.privacy.mechanisms.muffliato import epsilon_note

            self.epsilon_note, warning = epsilon_note(config)
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
            f"whole clipped gradient (B = {dp.expected_batch_size:.4g}, the expected batch): "
            "lower dp_noise_multiplier (or raise dp_target_epsilon)"
        )

    def epsilon(self) -> float:
        """This peer's epsilon so far at the run's delta (infinite without noise)."""
        if self.dp.noise_multiplier == 0:
            return math.inf
        return self.dp.epsilon(self.delta)

    def on_evaluation(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """This peer's epsilon; the worst peer's too where the peers' figures are released
        (then collective: every peer evaluates together)."""
        mine = self.epsilon()
        extra = {"epsilon": _json_number(mine), "delta": self.delta}
        if self.release:
            worst = torch.tensor([mine], dtype=torch.float64)
            self.comm.allreduce_(worst, op="max", metric=True)
            extra["epsilon_max"] = _json_number(float(worst[0]))
        return extra

    def own_figures(self) -> Dict[str, Any]:
        """This peer's privacy figures (computed once, at the end): its rate, sigma, steps, and
        epsilon by the run's accountant and by dp-accounting's PLD (add/remove; replace-one too
        where the sizes are released)."""
        if self._figures is None:
            history = [tuple(entry) for entry in self.dp.accountant.history]
            figures = {
                "sample_rate": self.dp.sample_rate,
                "noise_multiplier": self.dp.noise_multiplier,
                "steps": self.dp.steps,
                "delta": self.delta,
                "epsilon": _json_number(self.epsilon()),
                "epsilon_pld": _json_number(pld_epsilon(history, self.delta)),
                "dp_accountant": self.dp.accountant_name,
                "dp_adjacency": ADD_REMOVE,
            }
            if self.release:
                figures["epsilon_replace_one"] = _json_number(
                    pld_epsilon(history, self.delta, replace_one=True)
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

        Public figures only: delta (from the config or the public total size), C, the accountant,
        the adjacency, where the randomness comes from, and sigma when the config fixes it. Every
        peer's epsilons and sampling rate only with ``release_peer_statistics``."""
        kind = self.dp.randomness.kind
        fields = {
            "delta": self.delta,
            "max_grad_norm": _json_number(self.dp.max_grad_norm),
            "dp_mechanism": self.mechanism,
            "dp_exchanged_subspace": self.exchanged_subspace,
            "dp_accountant": self.dp.accountant_name,
            "dp_adjacency": ADD_REMOVE,
            "dp_randomness": kind,
            "dp_randomness_note": RANDOMNESS_NOTES[kind],
            "noise_multiplier": self.dp.noise_multiplier,
        }
        if self.epsilon_note:
            fields["dp_epsilon_note"] = self.epsilon_note
        mine = self.own_figures()
        if not self.release:
            if self.sigma_per_peer:  # each peer's own, from its own rate: not public
                fields["noise_multiplier"] = None
            fields["epsilon_per_peer"] = "in each peer's own peers/rank-K.json"
            return fields
        columns = {
            key: _gather_floats(self.comm, _float(mine[key]))
            for key in ("epsilon", "epsilon_pld", "epsilon_replace_one", "sample_rate")
        }
        fields.update(
            {
                key: [_json_number(v) for v in values]
                for key, values in columns.items()
                if key != "sample_rate"
            }
        )
        fields["sample_rate"] = columns["sample_rate"]
        fields["dp_adjacency_replace_one"] = REPLACE_ONE
        return fields

    # ---- checkpoint -------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The accountant's history and the noise generator (Poisson batches are the loop's)."""
        return self.dp.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.dp.load_state_dict(state)


def _json_number(value: float):
    """``value``, or the string "inf" (JSON has no infinity; sigma = 0 spends an infinite epsilon)."""
    return value if math.isfinite(value) else "inf"


def _float(value) -> float:
    """The inverse of `_json_number`."""
    return math.inf if value == "inf" else float(value)


def summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    """The summary table's privacy rows: differential privacy's, then the recorded views'
    (`views.observer_summary_rows`); none for a run with neither."""
    from gossip_powersgd.privacy.views import observer_summary_rows

    return dp_summary_rows(summary) + observer_summary_rows(summary)


def dp_summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    """The summary table's rows of differential privacy; none for a run without it."""
    if "dp_adjacency" not in summary:
        return []
    sigma = summary["noise_multiplier"]
    rows = [
        (
            "DP noise multiplier σ / clip norm C",
            f"{'per peer' if sigma is None else f'{sigma:.4g}'} / {summary['max_grad_norm']}",
        ),
        ("DP δ", f"{summary['delta']:g}"),
        ("DP adjacency", summary["dp_adjacency"]),
        ("DP randomness", summary["dp_randomness_note"]),
    ]
    if summary.get("dp_epsilon_note"):
        rows.append(("DP ε is", summary["dp_epsilon_note"]))
    if summary.get("dp_exchanged_subspace"):
        rows.append(
            (
                "DP update",
                "kept in the subspace PowerGossip's next messages read (post-processing: "
                "the same ε)",
            )
        )
    if "epsilon" not in summary:
        rows.append(("DP ε, sampling rate", "private: " + summary["epsilon_per_peer"]))
        return rows

    def span(key):
        values = [_float(v) for v in summary[key]]
        return f"[{min(values):.4g}, {max(values):.4g}]"

    rates = summary["sample_rate"]
    rows += [
        ("DP sampling rate q [min, max]", f"[{min(rates):.4g}, {max(rates):.4g}]"),
        (f"DP ε at δ ({summary['dp_accountant']}) [min, max]", span("epsilon")),
        ("DP ε at δ (PLD, dp-accounting) [min, max]", span("epsilon_pld")),
        ("DP ε at δ, replace-one (PLD) [min, max]", span("epsilon_replace_one")),
    ]
    return rows


def _eval_text(record: Dict[str, Any]) -> str:
    """The progress line's privacy figure: the worst peer's ε where the peers' figures are
    released, else this peer's own (rank 0 prints the line)."""

    def number(value):  # a number, or "inf" (no noise)
        return value if value == "inf" else f"{value:.3g}"

    if record.get("epsilon_max") is not None:
        return f"  worst ε {number(record['epsilon_max'])}"
    if record.get("epsilon") is not None:
        return f"  peer-0 ε {number(record['epsilon'])}"
    return ""


def _check_dp_keys_need_dp(config) -> None:
    """Refuse a ``dp_*`` key set while differential privacy is off: without this, a run given
    only ``dp_max_grad_norm`` (or ``dp_secure_noise``, ...) would train with no privacy at all and
    look as if it had some."""
    if dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon):
        return
    for key in DP_FEATURE.keys:
        if (
            key.name
            in (
                "dp_max_grad_norm",
                "dp_delta",
                "dp_accountant",
                "dp_fix_model",
                "dp_secure_noise",
                "dp_exchanged_subspace",
            )
            and getattr(config, key.name) != key.default
        ):
            raise ValueError(
                f"{key.name} is set but differential privacy is off (neither "
                "dp_noise_multiplier nor dp_target_epsilon is set): set one of them "
                f"to turn DP on (e.g. dp_noise_multiplier: 1.0), or drop {key.name}"
            )


def _check_subspace_config(config) -> None:
    """`dp_exchanged_subspace` is PowerGossip's, on DP-SGD alone (`privacy/subspace.py`)."""
    if not config.dp_exchanged_subspace:
        if config.dp_subspace_feedback:
            raise ValueError(
                "dp_subspace_feedback is for dp_exchanged_subspace: true: set that, or drop the key"
            )
        return
    algorithm = str(config.algorithm).split(":", 1)[0].strip()
    if algorithm != "powergossip":
        raise ValueError(
            "dp_exchanged_subspace works with algorithm powergossip (its messages read a "
            f"subspace), not {algorithm}: use powergossip or drop the key"
        )
    if config.dp_mechanism != "local":
        raise ValueError(
            "dp_exchanged_subspace works with dp_mechanism: local (DP-SGD alone), not "
            f"{config.dp_mechanism}: drop one of the two"
        )


def _validate(config) -> None:
    _check_dp_keys_need_dp(config)
    validate_privacy_config(config)
    _check_subspace_config(config)


#: Differential privacy as a config-driven feature (`training/features.py`): the ``dp_*`` keys
#: (also nested: ``dp: {noise_multiplier: 1.0, max_grad_norm: 1.0}``).
DP_FEATURE = register(
    Feature(
        name="dp",
        section="dp",
        keys=[
            Key(
                "dp_noise_multiplier",
                "Optional[float]",
                None,
                "Differential privacy (DP-SGD on each peer's own gradient): the noise multiplier "
                "sigma; the noise std is sigma x dp_max_grad_norm. DP is off unless this or "
                "dp_target_epsilon is set.",
            ),
            Key(
                "dp_max_grad_norm",
                "Optional[float]",
                None,
                "DP: the per-example clipping norm C (required when DP is on).",
            ),
            Key(
                "dp_delta",
                "Optional[float]",
                None,
                "DP: the delta of the reported (epsilon, delta); None = the largest power of ten <= "
                "1/(10 x the largest peer's shard size), stated in the summary.",
            ),
            Key(
                "dp_target_epsilon",
                "Optional[float]",
                None,
                "DP, instead of dp_noise_multiplier: the epsilon the run must end at; sigma is "
                "computed for the run's steps so that the peer with the largest sampling rate ends "
                "at or just below it.",
            ),
            Key(
                "dp_accountant",
                "str",
                "rdp",
                "DP accountant: rdp (Renyi DP) | prv (privacy random variables) | gdp (Gaussian DP).",
            ),
            Key(
                "dp_fix_model",
                "bool",
                False,
                "DP: let Opacus' validator replace layers it cannot privatize (BatchNorm -> "
                "GroupNorm, ...).",
            ),
            Key(
                "dp_secret",
                "str",
                "os",
                "DP: where each peer's secret key for its noise and Poisson masks comes from: os "
                "(fresh OS entropy, never written anywhere; not reproducible) | run_dir (generated on "
                "the peer when the run starts, kept only in RUN_DIR/secrets/rank-K.key, mode 0600, "
                "and in its checkpoint, so --resume continues bit for bit; needs out_dir). Never "
                "derived from the config, never sent.",
            ),
            Key(
                "dp_public_randomness",
                "bool",
                False,
                "DP, for exact-reproducibility tests only: noise and masks from the shared seed. "
                "Every peer can then regenerate them, so epsilon holds against outsiders only, not "
                "against the peers.",
            ),
            Key(
                "dp_secure_noise",
                "Optional[bool]",
                None,
                "DP: deprecated, the noise is always secret now (true is accepted; see dp_secret).",
            ),
            # ---- privacy mechanisms that use the graph (privacy/mechanisms/), on top of DP-SGD ----
            Key(
                "dp_mechanism",
                "str",
                "local",
                "DP mechanism: local (DP-SGD alone) | muffliato (the same noise, accounted per pair) "
                "| zipdl (zero-sum noise per edge on the messages) | decor (antisymmetric pairwise "
                "noise from Diffie-Hellman pair keys; dp_noise_multiplier is then its independent "
                "sigma_ind).",
            ),
            Key(
                "dp_exchanged_subspace",
                "bool",
                False,
                "DP with powergossip: keep each step's private update of every compressed matrix "
                "in the subspace the step's messages read, so that its noise is exchanged and "
                "averaged at once (post-processing: epsilon unchanged; privacy/subspace.py). "
                "Measured: the models drift less but learn less (privacy_dp_subspace.md).",
            ),
            Key(
                "dp_subspace_feedback",
                "bool",
                False,
                "dp_exchanged_subspace: keep the part of each update the projection cut off and "
                "add it to the next step's before projecting (error feedback; same epsilon).",
            ),
            Key(
                "dp_zipdl_sigma",
                "Optional[float]",
                None,
                "zipdl: std of the per-edge zero-sum noise on every message coordinate (parameter "
                "units).",
            ),
            Key(
                "dp_decor_sigma_cor",
                "Optional[float]",
                None,
                "decor: the pairs' noise multiplier sigma_cor (std sigma_cor x dp_max_grad_norm per "
                "pair).",
            ),
        ],
        validate=_validate,
        hooks=lambda config: [
            h for h in (privacy_hook(config), subspace_hook(config)) if h is not None
        ],
        summary_rows=dp_summary_rows,
        eval_text=_eval_text,
        private=lambda config: dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon),
    )
)
