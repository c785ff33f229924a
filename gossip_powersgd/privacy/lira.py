"""LiRA, the likelihood-ratio membership attack (Carlini, Chien, Nasr, Song, Terzis, Tramèr,
"Membership Inference Attacks From First Principles", IEEE S&P 2022), and calibrated LOSS attacks.

Reference models are trained on random halves of a candidate pool (the victim's members and its
held-out non-members), each candidate in exactly half of them (`inclusion_masks`); the attacker
knows the pool, not which half the victim trained on. Each model's statistic of a candidate
(x, y) is the logit-scaled confidence phi = log p_y - log(1 - p_y) = z_y - logsumexp_{j != y} z_j
(`logit_confidence`, computed from the logits z without forming p). Per candidate:

  offline  score = (phi_target - mu_out) / sigma_out: how far above the reference models that did
           not train on it the target's confidence lies (one-sided test of the OUT Gaussian);
  online   score = log N(phi_target; mu_in, sigma_in) - log N(phi_target; mu_out, sigma_out).

With few reference models the per-candidate variances are noisy; `lira_scores` uses the variance
pooled over candidates (Carlini et al.'s "global variance", their recommendation below 64 models).

Calibrated LOSS (difficulty calibration, Watson et al., ICLR 2022): -loss_target + mean OUT loss.
Class-conditional LOSS: -loss z-scored within its class by the OUT reference losses of that class.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..training.validation import warmup_steps

__all__ = [
    "calibrated_loss_scores",
    "class_conditional_loss_scores",
    "inclusion_masks",
    "lira_scores",
    "logit_confidence",
    "reference_statistics",
    "train_classifier",
]


def inclusion_masks(candidates: int, models: int, seed: int = 0) -> np.ndarray:
    """(models, candidates) booleans: model k trains on candidate i; every candidate is in exactly
    half of the models (`models` must be even)."""
    if models < 2 or models % 2:
        raise ValueError(f"LiRA needs an even number >= 2 of reference models, got {models}")
    rng = np.random.default_rng(seed)
    masks = np.zeros((models, candidates), dtype=bool)
    for i in range(candidates):
        masks[rng.permutation(models)[: models // 2], i] = True
    return masks


@torch.no_grad()
def logit_confidence(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 2048
) -> np.ndarray:
    """phi = z_y - logsumexp_{j != y} z_j of every sample under `model` (eval mode), float64."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for k in range(0, len(x), batch):
            z = model(x[k : k + batch]).double()
            yy = y[k : k + batch]
            true = z.take_along_dim(yy[:, None], 1).squeeze(1)
            mask = torch.nn.functional.one_hot(yy, z.shape[1]).bool()
            others = z.masked_fill(mask, float("-inf")).logsumexp(1)
            out.append(true - others)
    finally:
        model.train(was_training)
    return torch.cat(out).numpy()


def _masks(masks, shape: Tuple[int, ...], need_in: bool = False) -> np.ndarray:
    """`masks` as (models, candidates) booleans of `shape`: bools, or 0/1 (read back from a file;
    `~` of an integer array is its bitwise not, true everywhere). Every candidate needs a model
    without it (the OUT statistics) and, with `need_in`, one with it."""
    array = np.asarray(masks)
    if array.dtype != bool:
        if not (np.issubdtype(array.dtype, np.number) and np.isin(array, (0, 1)).all()):
            raise ValueError(
                f"masks must be booleans or 0/1 (model k trained on candidate i), got dtype "
                f"{array.dtype}: pass lira.inclusion_masks(...)"
            )
        array = array.astype(bool)
    if array.shape != tuple(shape):
        raise ValueError(
            f"masks of shape {array.shape} for statistics of shape {tuple(shape)} (models, "
            "candidates): pass the masks the reference models were trained with"
        )
    for side, count in (("without", (~array).sum(0)), ("with", array.sum(0)))[: 1 + need_in]:
        missing = np.flatnonzero(count == 0)
        if missing.size:
            raise ValueError(
                f"candidates {missing[:5].tolist()} have no reference model trained {side} "
                "them: every candidate must be in some models and out of others "
                "(lira.inclusion_masks puts each in exactly half)"
            )
    return array


def _pooled(phi: np.ndarray, mask: np.ndarray) -> Tuple[np.ndarray, float]:
    """Per-candidate mean over the models where `mask`, and the variance pooled over candidates."""
    count = mask.sum(0)
    mean = np.where(mask, phi, 0).sum(0) / count
    var = (np.where(mask, phi - mean, 0) ** 2).sum() / max(1, (count - 1).sum())
    return mean, float(max(var, 1e-12))


def lira_scores(
    target: np.ndarray, reference: np.ndarray, masks: np.ndarray, online: bool = False
) -> np.ndarray:
    """LiRA scores of the candidates (higher: member) from the target's `logit_confidence`, the
    reference models' (models, candidates) confidences and their `inclusion_masks`."""
    target, reference = np.asarray(target, float), np.asarray(reference, float)
    masks = _masks(masks, reference.shape, need_in=online)
    if target.shape != masks.shape[1:]:
        raise ValueError(
            f"shapes disagree: target {target.shape}, reference {reference.shape}, "
            f"masks {masks.shape}"
        )
    mu_out, var_out = _pooled(reference, ~masks)
    if not online:
        return (target - mu_out) / np.sqrt(var_out)
    mu_in, var_in = _pooled(reference, masks)
    return (
        -((target - mu_in) ** 2) / (2 * var_in)
        - 0.5 * np.log(var_in)
        + (target - mu_out) ** 2 / (2 * var_out)
        + 0.5 * np.log(var_out)
    )


def calibrated_loss_scores(
    target_loss: np.ndarray, reference_loss: np.ndarray, masks: np.ndarray
) -> np.ndarray:
    """-loss_target + mean OUT reference loss of each candidate (higher: member)."""
    reference_loss = np.asarray(reference_loss, float)
    mean_out, _ = _pooled(reference_loss, ~_masks(masks, reference_loss.shape))
    return -np.asarray(target_loss, float) + mean_out


def class_conditional_loss_scores(
    target_loss: np.ndarray, labels: np.ndarray, reference_loss: np.ndarray, masks: np.ndarray
) -> np.ndarray:
    """-loss z-scored by the OUT reference losses of the candidate's class (higher: member)."""
    target_loss, labels = np.asarray(target_loss, float), np.asarray(labels)
    reference_loss = np.asarray(reference_loss, float)
    masks = _masks(masks, reference_loss.shape)
    out = np.empty_like(target_loss)
    for c in np.unique(labels):
        where = labels == c
        pool = reference_loss[:, where][~masks[:, where]]
        out[where] = -(target_loss[where] - pool.mean()) / max(pool.std(), 1e-12)
    return out


def schedule_factor(step: int, per_epoch: int, epochs: int, warmup_epochs: float) -> float:
    """The learning rate of step `step` (0-based) over the base rate: linear warm-up over
    `warmup_epochs`, then cosine decay to 0 over the remaining steps (the trainer's `cosine`).
    The warm-up's steps are the trainer's (`training.validation.warmup_steps`, which refuses a
    positive warm-up of fewer than 2 steps)."""
    warmup = warmup_steps(warmup_epochs, per_epoch)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, epochs * per_epoch - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_classifier(
    make_model: Callable[[], torch.nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr: float,
    batch: int,
    momentum: float = 0.9,
    seed: int = 0,
    warmup_epochs: float = 0.0,
) -> torch.nn.Module:
    """A reference model: SGD with momentum on (x, y), shuffled per epoch, the learning rate of
    the trainer's recipe (`training.trainer.learning_rate`): linear warm-up over `warmup_epochs`,
    then a cosine decay over the remaining steps. Raises a one-line ValueError if the model
    leaves the finite numbers (its recipe diverges: lower lr or warm up)."""
    generator = torch.Generator().manual_seed(seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    per_epoch = max(1, -(-len(x) // batch))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedule_factor(step, per_epoch, epochs, warmup_epochs)
    )
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for k in range(0, len(x), batch):
            pick = order[k : k + batch]
            optimizer.zero_grad()
            F.cross_entropy(model(x[pick]), y[pick]).backward()
            optimizer.step()
            schedule.step()
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        raise ValueError(
            f"a reference model diverged (lr {lr:g}, batch {batch}, {epochs} epochs, warm-up "
            f"{warmup_epochs:g} epochs): its parameters are not finite; lower lr or warm up longer"
        )
    return model


def reference_statistics(models, x: torch.Tensor, y: torch.Tensor) -> Dict[str, np.ndarray]:
    """(models, candidates) logit confidences and losses of the reference models."""
    from gossip_powersgd.privacy.membership import loss_scores

    return {
        "phi": np.stack([logit_confidence(m, x, y) for m in models]),
        "loss": np.stack([-loss_scores(m, x, y) for m in models]),
    }
