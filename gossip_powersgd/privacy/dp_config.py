"""The ``dp_*`` config keys of differential privacy, their validation, and the public quantities
a peer's noise is chosen from.

What a neighbour may learn from a peer's noise: its scale, sigma x C / divisor per coordinate, is
visible in the peer's messages. So sigma and the divisor come from public quantities only: the
config, the public number of training samples, the number of peers. With a target epsilon and
private shard sizes, sigma is solved for one public sampling rate (`public_rate`), and a peer
whose own rate batch / shard size is above it samples at that rate instead (fewer records per
step); every peer divides by the configured batch size. A peer's epsilon, a function of its own
rate, stays in its own file.
"""

from __future__ import annotations

import math
from typing import Optional

from gossip_powersgd.privacy.dpsgd import dp_enabled, validate_dp_options
from gossip_powersgd.training.datasets import augmentation_off
from gossip_powersgd.training.features import Key, peer_statistics_private

__all__ = [
    "DP_KEYS",
    "RANDOMNESS_NOTES",
    "check_noise_scale",
    "keeps_peer_statistics_private",
    "public_rate",
    "randomness_kind",
    "validate_dp_config",
    "validate_privacy_config",
]

#: What each randomness kind means for the guarantee, in the words the summary uses.
RANDOMNESS_NOTES = {
    "os": "secret per peer: a fresh OS-entropy key, never written anywhere",
    "run_dir": "secret per peer while its files are its own: a key in its own folder "
    "secrets/rank-K/ (mode 0700) and in each of its checkpoints; whoever reads them can remove "
    "its noise (a run directory the peers share shares their noise)",
    "public": "PUBLIC (dp_public_randomness): noise and masks derive from the shared seed, so every "
    "peer can regenerate and subtract them; ε (local DP-SGD) holds against outsiders only, not "
    "against the peers, under any adjacency (add/remove or replace-one)",
}

#: What rank 0 prints when a run keeps its keys in the run directory.
RUN_DIR_WARNING = (
    "WARNING: dp_secret: run_dir keeps each peer's DP key in RUN_DIR/secrets/rank-K/ and in each "
    "of its checkpoints; whoever can read them regenerates that peer's noise and removes it, so a "
    "run directory that the peers share (one machine, a shared file system) shares the noise "
    "with every peer: give each peer its own run directory, or use dp_secret: os"
)

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


def public_rate(config, train_size: int, peers: int) -> float:
    """The public sampling rate a target epsilon's sigma is solved for: batch_size /
    dp_public_shard_size (default: the public number of training samples // peers), at most 1."""
    size = config.dp_public_shard_size
    if size is None:
        size = max(1, int(train_size) // int(peers))
    return min(1.0, config.batch_size / int(size))


def _check_no_augmentation(config) -> None:
    """Refuse a dataset that augments its training records under DP. The crop and flip of a
    record are drawn from the batch's generator in the order of the batch's records, so adding
    one record to a Poisson batch changes every later record's augmentation: the clipped sum then
    moves by more than C, the sensitivity the noise is calibrated to."""
    if not dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon):
        return
    fixed = augmentation_off(config.dataset)
    if fixed is not None:
        raise ValueError(
            f"dataset {config.dataset!r} augments its training records, drawing each record's "
            "crop and flip by its position in the batch: under differential privacy one record "
            "would change the others' and the step would move by more than dp_max_grad_norm; "
            f"turn it off: dataset: {fixed}"
        )


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
    _check_no_augmentation(config)
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
    size = config.dp_public_shard_size
    if size is not None and (isinstance(size, bool) or int(size) != size or size < 1):
        raise ValueError(
            f"dp_public_shard_size must be a positive integer (a shard size declared public), "
            f"got {size!r}"
        )
    if size is not None and config.dp_target_epsilon is None:
        raise ValueError(
            "dp_public_shard_size is for dp_target_epsilon (the rate its sigma is solved "
            "for): set that, or drop the key"
        )
    if size is not None and config.release_peer_statistics:
        raise ValueError(
            "dp_public_shard_size is for private shard sizes; with release_peer_statistics: "
            "true the peers share their sizes and sigma is solved for their own rates: drop "
            "the key, or release_peer_statistics"
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


def _check_dp_keys_need_dp(config) -> None:
    """Refuse a ``dp_*`` key set while differential privacy is off: without this, a run given
    only ``dp_max_grad_norm`` (or ``dp_secure_noise``, ``dp_public_randomness``, ...) would train
    with no privacy at all and look as if it had some."""
    if dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon):
        return
    for key in DP_KEYS:
        if (
            key.name
            in (
                "dp_max_grad_norm",
                "dp_delta",
                "dp_accountant",
                "dp_fix_model",
                "dp_secure_noise",
                "dp_exchanged_subspace",
                "dp_public_shard_size",
                "dp_secret",
                "dp_public_randomness",
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
    algorithm = config.algorithm_spec.name
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


def validate_dp_config(config) -> None:
    """The DP feature's `validate`: one-line ValueError for the first bad ``dp_*`` key."""
    _check_dp_keys_need_dp(config)
    validate_privacy_config(config)
    _check_subspace_config(config)


#: The ``dp_*`` keys (also nested: ``dp: {noise_multiplier: 1.0, max_grad_norm: 1.0}``).
DP_KEYS = [
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
        "1/(10 n), stated in the summary: n the largest peer's shard size where the peers' sizes "
        "are released (release_peer_statistics), else the public training-set size (no smaller).",
    ),
    Key(
        "dp_target_epsilon",
        "Optional[float]",
        None,
        "DP, instead of dp_noise_multiplier: the epsilon the run must end at. Sigma is "
        "solved for the run's steps at a public sampling rate, batch_size / "
        "dp_public_shard_size, one sigma for every peer: a peer's noise says nothing about "
        "its shard size; each peer samples at min(batch_size / its shard size, that rate) "
        "and ends at or below the target. With release_peer_statistics the sizes are "
        "public: sigma is solved for the largest rate, under replace-one adjacency.",
    ),
    Key(
        "dp_public_shard_size",
        "Optional[int]",
        None,
        "DP with dp_target_epsilon and private shard sizes (refused with "
        "release_peer_statistics): the shard size, declared public, whose rate batch_size / "
        "it the one sigma is solved for (a peer with a smaller shard samples at that rate, "
        "fewer than batch_size records per step on average); None = the public number of "
        "training samples // peers.",
    ),
    Key(
        "dp_accountant",
        "str",
        "rdp",
        "DP accountant: rdp (Renyi DP) | prv (privacy random variables), each peer's add/"
        "remove epsilon; dp-accounting's PLD is reported beside it. gdp (Gaussian DP) is "
        "refused: it can understate epsilon.",
    ),
    Key(
        "dp_fix_model",
        "bool",
        False,
        "DP: let Opacus' validator replace layers it cannot privatize (BatchNorm -> "
        "GroupNorm, ...: another model). LSTM and GRU need no key: they are swapped for "
        "Opacus' DPLSTM / DPGRU, the same function with the same parameters.",
    ),
    Key(
        "dp_secret",
        "str",
        "os",
        "DP: where each peer's secret key for its noise and Poisson masks comes from: os "
        "(fresh OS entropy, never written anywhere; not reproducible: a resumed run sends the "
        "steps after its checkpoint again with new noise, and its epsilon counts them twice) "
        "| run_dir (generated on "
        "the peer when the run starts, kept only in its own folder RUN_DIR/secrets/rank-K/ "
        "(mode 0700) and in each of its checkpoints, so --resume draws the same noise; needs "
        "out_dir; a step taken again that is not what was sent, bit for bit (another device, "
        "thread count or torch build), is sent as pure noise under a new key, and the steps "
        "released from it on are then counted as under os). Whoever reads that folder or a checkpoint can remove the peer's "
        "noise: a run directory shared by the peers shares their noise (the run warns). "
        "Never derived from the config, never sent.",
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
        "DP mechanism: local (DP-SGD alone) | muffliato (the same noise; its network bound "
        "is not a guarantee for training, the epsilon is DP-SGD's) "
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
        "zipdl: std of the per-edge zero-sum noise on every message coordinate (parameter units).",
    ),
    Key(
        "dp_decor_sigma_cor",
        "Optional[float]",
        None,
        "decor: the pairs' noise multiplier sigma_cor (std sigma_cor x dp_max_grad_norm per pair).",
    ),
]
