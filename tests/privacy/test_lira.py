"""`privacy.lira`: LiRA and its reference models — members of an overfitted model found, an
independent model's at chance; the trainer's learning-rate schedule; the calibrated scores by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossip_powersgd.privacy.membership import auc, loss_scores, null_auc_std


def test_lira_finds_an_overfitted_models_members_and_not_an_independent_models():
    """A linear model in 400 dimensions on 60 random-label points memorises them (its members'
    confidence is high) while its confidence on an unseen point stays near the prior: LiRA with
    8 reference models on random halves of the 120 candidates separates the members (AUC near 1);
    for a model trained on other data every candidate is out, so its AUC is chance (within 4 null
    standard deviations)."""
    from gossip_powersgd.privacy.lira import (
        inclusion_masks,
        lira_scores,
        logit_confidence,
        train_classifier,
    )

    def blobs(seed):
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(120, 400, generator=generator), torch.randint(
            0, 4, (120,), generator=generator
        )

    def make():
        model = torch.nn.Linear(400, 4)
        torch.nn.init.zeros_(model.weight)
        torch.nn.init.zeros_(model.bias)
        return model

    x, y = blobs(5)
    masks = inclusion_masks(len(x), 8, seed=0)
    assert (masks.sum(0) == 4).all()
    fit = dict(epochs=30, lr=0.02, batch=60)
    references = [
        train_classifier(
            make, x[torch.from_numpy(masks[k])], y[torch.from_numpy(masks[k])], seed=k, **fit
        )
        for k in range(8)
    ]
    phi = np.stack([logit_confidence(m, x, y) for m in references])
    loss = np.stack([-loss_scores(m, x, y) for m in references])
    members = np.zeros(len(x), dtype=bool)
    members[np.random.default_rng(1).permutation(len(x))[:60]] = True
    pick = torch.from_numpy(members)
    target = train_classifier(make, x[pick], y[pick], seed=100, **fit)
    independent = train_classifier(make, *blobs(6), seed=101, **fit)
    for online in (False, True):
        scores = lira_scores(logit_confidence(target, x, y), phi, masks, online=online)
        assert auc(scores[members], scores[~members]) > 0.98
        blind = lira_scores(logit_confidence(independent, x, y), phi, masks, online=online)
        assert abs(auc(blind[members], blind[~members]) - 0.5) < 4 * null_auc_std(60, 60)
    assert loss.shape == masks.shape
    with pytest.raises(ValueError, match="even number"):
        inclusion_masks(10, 3)


def test_reference_models_follow_the_trainers_learning_rate_schedule():
    """The reference models' learning rate is the trainer's (`trainer.learning_rate`): linear
    warm-up, then cosine decay, step for step (exact: the same float formula); the recipe
    without warm-up is torch's CosineAnnealingLR, the previous schedule. A recipe that diverges
    is refused in one line naming the reference model, not passed on as non-finite scores."""
    from gossip_powersgd.privacy.lira import schedule_factor, train_classifier
    from gossip_powersgd.training.config import config_from_dict
    from gossip_powersgd.training.trainer import learning_rate

    for warmup, epochs, per_epoch in ((1, 15, 55), (0, 3, 7), (2.5, 4, 10)):
        config = config_from_dict(
            dict(lr=0.4, epochs=epochs, warmup_epochs=warmup, schedule="cosine")
        )
        for step in range(epochs * per_epoch):
            assert 0.4 * schedule_factor(step, per_epoch, epochs, warmup) == pytest.approx(
                learning_rate(config, step, per_epoch), rel=1e-12
            )
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.4)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 21)
    for step in range(21):
        assert 0.4 * schedule_factor(step, 7, 3, 0) == pytest.approx(
            optimizer.param_groups[0]["lr"], rel=1e-9
        )
        optimizer.step()
        cosine.step()

    # One step of lr 1e30 on inputs of size 1e6 puts logits beyond float32's 3.4e38: inf, NaN.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=generator) * 1e6
    y = torch.randint(0, 3, (64,), generator=generator)
    with pytest.raises(ValueError, match="a reference model diverged .*lower lr"):
        train_classifier(lambda: torch.nn.Linear(5, 3), x, y, epochs=2, lr=1e30, batch=16)


def test_calibrated_and_class_conditional_loss_scores_by_hand():
    from gossip_powersgd.privacy.lira import (
        calibrated_loss_scores,
        class_conditional_loss_scores,
        lira_scores,
    )

    reference = np.array([[1.0, 4.0], [3.0, 2.0]])  # 2 models x 2 candidates
    masks = np.array([[True, False], [False, True]])  # model 0 trained on candidate 0
    # OUT mean: candidate 0 -> model 1's 3.0, candidate 1 -> model 0's 4.0
    assert calibrated_loss_scores(np.array([0.5, 1.0]), reference, masks).tolist() == [2.5, 3.0]
    # OUT losses per class: class 0 holds both candidates: OUT values 3.0 and 4.0 (mean 3.5, sd 0.5)
    scores = class_conditional_loss_scores(np.array([3.0, 4.5]), np.array([0, 0]), reference, masks)
    assert scores.tolist() == [1.0, -2.0]
    # offline LiRA: (phi - mu_out) / sigma, sigma pooled; one OUT value per candidate gives no
    # spread, so the floor 1e-12 of the variance applies and the sign is what is left to test
    assert np.sign(lira_scores(np.array([5.0, 3.0]), reference, masks)).tolist() == [1.0, -1.0]


def test_integer_masks_give_the_boolean_scores_and_a_candidate_never_out_is_refused():
    """Masks read back as 0/1 integers score as the booleans do (`~` of an int array is its bitwise
    not, -1 or -2, true everywhere: the OUT mean would silently take every model); a candidate that
    no reference model left out (or, online, none trained on) is refused by name instead of
    scoring NaN."""
    from gossip_powersgd.privacy.lira import (
        calibrated_loss_scores,
        class_conditional_loss_scores,
        inclusion_masks,
        lira_scores,
    )

    rng = np.random.default_rng(0)
    masks = inclusion_masks(5, 4, seed=0)
    reference = rng.standard_normal((4, 5)) + 3.0 * masks  # IN models: higher confidence
    target = rng.standard_normal(5)
    for online in (False, True):
        as_bool = lira_scores(target, reference, masks, online=online)
        assert np.array_equal(lira_scores(target, reference, masks.astype(int), online), as_bool)
    loss, labels = rng.random(5), np.array([0, 0, 1, 1, 1])
    ints = masks.astype(np.int64)
    assert np.array_equal(
        calibrated_loss_scores(loss, reference, ints),
        calibrated_loss_scores(loss, reference, masks),
    )
    assert np.array_equal(
        class_conditional_loss_scores(loss, labels, reference, ints),
        class_conditional_loss_scores(loss, labels, reference, masks),
    )
    always_in = masks.copy()
    always_in[:, 2] = True
    with pytest.raises(
        ValueError, match=r"candidates \[2\] have no reference model trained without"
    ):
        lira_scores(target, reference, always_in)
    never_in = masks.copy()
    never_in[:, 3] = False
    lira_scores(target, reference, never_in)  # offline needs OUT models only
    with pytest.raises(ValueError, match=r"candidates \[3\] have no reference model trained with "):
        lira_scores(target, reference, never_in, online=True)
    with pytest.raises(ValueError, match="masks must be booleans or 0/1"):
        lira_scores(target, reference, masks * 2.5)
