"""Canaries in a training run, for the one-run audit (`audit`): inserted, then scored.

`Canaries(victim, x, y)` is a `TrainingHooks`: at set-up it adds to the victim's shard the
canaries its coins include (`audit.draw_inclusion`, from a keystream secret to the victim: by
default fresh OS entropy, never written; the observer must not know which are in), before the
privacy hook replaces the batches with Poisson sampling, so DP-SGD treats them as any other
record. Pass it first: ``train(comm, config, hooks=[Canaries(...)])`` (the hooks a caller passes
run before those the config turns on). It holds the truth (`included`) for the referee; nothing
of it is sent or printed. A resumed run must be given the same keystream (``dp_secret:
run_dir``'s key, for instance: `seeds.Randomness.run_dir_key`); a different one is refused.

Scores, higher meaning "more likely included", from what an observer has:

* `loss_drop_scores(model, reference, x, y)`: how much lower a canary's loss is under `model`
  than under `reference` (the common initial model every peer knows): the LOSS attack calibrated
  per canary;
* `observed_model(view, victim, template)`: the model an observer reconstructs of the victim from
  its recorded view (exact gossip: the victim's parameters as sent; PowerGossip: least squares
  over the messages, `reconstruction.reconstruct`), to score with the above;
* the victim's own final model gives the white-box bound: what every message is post-processing
  of.

`public_canaries` draws the auditor's usual canaries (Gaussian inputs at the data's scale with a
uniformly random label: records unlike any real one) from the run's seed: public, as the threat
model allows; only their inclusion is secret. `canary_hooks` gives one `Canaries` per victim.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from gossip_powersgd.privacy.audit import check_canary_count, draw_inclusion
from gossip_powersgd.privacy.seeds import Randomness
from gossip_powersgd.training.hooks import SetupContext, TrainingHooks

__all__ = [
    "CANARY_SEED",
    "Canaries",
    "canary_hooks",
    "loss_drop_scores",
    "losses",
    "observed_model",
    "public_canaries",
]

#: The keystream-independent (public) generator of `public_canaries`: a function of the run's seed.
CANARY_SEED = 0xCA7A


class Canaries(TrainingHooks):
    """Insert the included ones of canaries (x, y) into peer `victim`'s shard (see the module doc)."""

    name = "canaries"

    def __init__(
        self,
        victim: int,
        x: torch.Tensor,
        y: torch.Tensor,
        randomness: Optional[Randomness] = None,
    ):
        if len(x) != len(y) or len(y) < 1:
            raise ValueError(
                f"canaries need as many inputs as labels, >= 1; got {len(x)}, {len(y)}"
            )
        self.victim = int(victim)
        self.x, self.y = x, y
        self.randomness = randomness if randomness is not None else Randomness.os_entropy()
        #: The truth the referee compares guesses with: canary i is in the victim's data.
        self.included = draw_inclusion(self.randomness, len(y))

    def setup(self, context: SetupContext) -> None:
        if context.comm.rank != self.victim:
            return
        from gossip_powersgd.training.batches import Batches

        batches = context.batches
        if type(batches) is not Batches:
            raise ValueError(
                "Canaries must run before any hook that replaces the batches (differential "
                "privacy's Poisson sampling): pass it in train(..., hooks=[...])"
            )
        x, y = batches.x, batches.y
        if tuple(self.x.shape[1:]) != tuple(x.shape[1:]) or self.y.dtype != y.dtype:
            raise ValueError(
                f"canaries of shape {tuple(self.x.shape[1:])} ({self.y.dtype} labels) do not fit "
                f"the data's {tuple(x.shape[1:])} ({y.dtype} labels)"
            )
        keep = self.included.to(x.device)
        joined = Batches(
            torch.cat([x, self.x.to(x)[keep]]),
            torch.cat([y, self.y.to(y.device)[keep]]),
            batches.batch_size,
            seed=batches.seed,
            rank=batches.rank,
        )
        joined.transform = batches.transform
        context.batches = joined

    def state_dict(self) -> Dict[str, Any]:
        return {"included": self.included.clone()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        saved = state.get("included")
        if saved is None or not torch.equal(saved.to(torch.bool), self.included):
            raise ValueError(
                "the checkpoint's canaries were drawn with another keystream: resume with the "
                "Randomness the run was started with (a run_dir key)"
            )


def losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Each example's cross-entropy under `model` (eval mode, no gradient); a target per token
    (a language model): the mean over its tokens."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(x)
            if logits.ndim > 2:  # (batch, tokens, vocabulary)
                per_token = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
                values = per_token.mean(dim=1)
            else:
                values = F.cross_entropy(logits, y, reduction="none")
    finally:
        model.train(was_training)
    return values.double().cpu().numpy()


def loss_drop_scores(
    model: torch.nn.Module, reference: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> np.ndarray:
    """loss under `reference` - loss under `model`, per canary: higher, more likely trained on."""
    return losses(reference, x, y) - losses(model, x, y)


def observed_model(view, victim: int, template: torch.nn.Module, step: Optional[int] = None):
    """The observer's reconstruction of `victim`'s model at `step` (default: the last step the
    view holds a message of it for), as a copy of `template` (the run's architecture)."""
    from gossip_powersgd.privacy.membership import model_with_parameters
    from gossip_powersgd.privacy.reconstruction import reconstruct

    estimates = reconstruct(view, victim)
    if not estimates:
        raise ValueError(f"the view holds no message of peer {victim}: nothing to reconstruct")
    step = max(estimates) if step is None else int(step)
    if step not in estimates:
        raise ValueError(f"the view holds no estimate of peer {victim} at step {step}")
    return model_with_parameters(template, estimates[step])


def public_canaries(data, m: int, victim: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """m public canaries for `victim` of a run with seed `seed`: Gaussian inputs with the mean and
    standard deviation of `data`'s training inputs (a `training.data` dataset), labels uniform
    over its classes; the same for the same (victim, seed)."""
    g = torch.Generator().manual_seed(CANARY_SEED * 1000 + 100 * int(seed) + int(victim))
    x_train = data.x_train.float()
    x = torch.randn((m, *x_train.shape[1:]), generator=g) * x_train.std() + x_train.mean()
    y = torch.randint(0, data.num_classes, (m,), generator=g, dtype=data.y_train.dtype)
    return x.to(data.x_train.dtype), y


def canary_hooks(victims: Sequence[int], data, m: int, seed: int) -> List[Canaries]:
    """One `Canaries` hook per victim with its `public_canaries`, each with its own secret
    (OS-entropy) inclusion coins, named after its victim (checkpoint state is keyed by name).
    Fewer than `audit.MIN_CANARIES` canaries in all are refused here, before any training."""
    check_canary_count(len(victims) * int(m))
    hooks = [Canaries(v, *public_canaries(data, m, v, seed)) for v in victims]
    for hook in hooks:
        hook.name = f"canaries of peer {hook.victim}"
    return hooks
