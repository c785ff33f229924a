"""What a curious neighbour learns: recorded views, model reconstruction and membership inference
(the network-DP accountant: tests/privacy/test_network_dp.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import topologies
from tests.conftest import run_scenario_mpi
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy.membership import (
    auc,
    loss_attack,
    loss_scores,
    membership_inference,
    membership_samples,
    model_with_parameters,
    null_auc_std,
    tpr_at_fpr,
)
from gossip_powersgd.privacy.reconstruction import (
    reconstruct,
    reconstruction_errors,
    relative_error,
    trivial_estimates,
)
from gossip_powersgd.privacy.views import ObserverHooks, load_view, observed_dir
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.data import load_dataset
from gossip_powersgd.training.models import build_model
from gossip_powersgd.training.trainer import train
from privacy_attack_scenarios import observed_gossip

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "experiments" / "configs" / "tiny.yaml"
RING = topologies.ring(4)

SPECS = [
    "exact",
    "powergossip:rank=1",
    "powergossip:rank=6,min_compression_rate=0",
    "choco:compressor=topk:0.3,gamma=0.3",
    "deepsqueeze:compressor=sign,gamma=0.1",
]


def run_views(spec, steps=4, observe_every=1, tmp=None):
    """Gossip on a 4-ring with every rank observing; returns (results, views by rank)."""
    results = LocalCluster(RING, timeout=30).run(
        observed_gossip, spec, steps, "all", tmp, str(observe_every)
    )
    views = [load_view(observed_dir(tmp, k)) for k in range(4)] if tmp is not None else None
    return results, views


# ---- recorded views ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_a_recorded_view_is_bit_for_bit_what_the_algorithm_consumed(spec, tmp_path):
    results, views = run_views(spec, steps=3, tmp=tmp_path)
    for rank, (result, view) in enumerate(zip(results, views)):
        assert view.steps == [0, 1, 2]
        assert view.meta["observer"] == rank and view.meta["neighbors"] == list(
            RING.neighbors(rank)
        )
        for step, record in enumerate(view.records):
            assert len(record["messages"]) == len(
                RING.neighbors(rank)
            )  # one exchange per step here
            for message in record["messages"]:
                consumed = result["consumed"][step][message["sender"]]
                assert message["tensor"].dtype == consumed.dtype
                assert torch.equal(message["tensor"], consumed)
            for own, sent in zip(record["own"], result["sent"][step]):
                assert torch.equal(own, sent)
        if spec.startswith("powergossip"):
            assert [r["messages"][0]["kind"] for r in view.records] == ["right", "left", "right"]


def test_recording_changes_no_model_bit():
    for spec in SPECS:
        recorded = LocalCluster(RING).run(observed_gossip, spec, 3, "all")
        plain = LocalCluster(RING).run(observed_gossip, spec, 3, "")
        for a, b in zip(recorded, plain):
            assert all(torch.equal(x, y) for x, y in zip(a["final"], b["final"])), spec
            assert "records" in a and "records" not in b


def test_observe_every_bounds_what_is_recorded(tmp_path):
    _, views = run_views("exact", steps=5, observe_every=2, tmp=tmp_path)
    assert views[0].steps == [0, 2, 4]
    with pytest.raises(ValueError, match="observe_every must be an integer >= 1"):
        ObserverHooks([0], observe_every=0)


def test_bad_observers_and_missing_views_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"observers \[4\] are not ranks of this 4-peer run"):
        train_all(tiny(), lambda: ObserverHooks([4]))
    with pytest.raises(ValueError, match="holds no recorded view"):
        load_view(tmp_path)


def tiny(**changes):
    base = load_config(TINY, deep=False).replace(
        quiet=True, checkpoint_every=0, log_every=0, epochs=1
    )
    return base.replace(**changes)


def train_all(config, make_hooks):
    hooks = {}

    def peer(comm):
        hooks[comm.rank] = make_hooks()
        return train(comm, config, hooks=[hooks[comm.rank]])

    return LocalCluster(topologies.parse(config.topology), timeout=60).run(peer), hooks


def test_observer_hooks_record_under_train_without_changing_the_run(tmp_path):
    run = tmp_path / "run"
    observed, hooks = train_all(tiny(out_dir=str(run)), lambda: ObserverHooks(range(4)))
    plain, _ = train_all(tiny(out_dir=str(tmp_path / "plain")), lambda: ObserverHooks([]))
    assert observed[0]["model_sha256"] == plain[0]["model_sha256"]
    assert observed[0]["mb_sent_per_peer"] == plain[0]["mb_sent_per_peer"]  # counted once
    assert not (tmp_path / "plain" / "observed").exists()
    steps = observed[0]["history"][-1]["step"]
    views = [load_view(observed_dir(run, k)) for k in range(4)]
    view0, view1 = views[0], views[1]
    assert view1.steps == list(range(steps))
    message_bytes = sum(
        m["tensor"].numel() * m["tensor"].element_size()
        for r in view1.records
        for m in r["messages"]
    )
    assert hooks[1].bytes_recorded == message_bytes > 0
    assert observed[1]["history"][-1]["observed_bytes"] == message_bytes

    # The observer (rank 1) reconstructs its neighbour 0; rank 0's own view holds the truth.
    errors = reconstruction_errors(view1, 0, view0.own_trajectory(), window=4)
    assert errors["steps"] == list(range(steps))
    assert errors["estimate"][-1] < errors["trivial"][-1]

    # Membership of rank 0's shard with its true model, the reconstruction, the observer's model,
    # and the average of all four.
    config = tiny()
    dataset = load_dataset(config.dataset, config.seed)
    members, nonmembers = membership_samples(dataset, 0, 4, config.partition, config.seed)
    assert len(members[0]) == len(nonmembers[0]) > 0
    model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)
    last = steps - 1
    average = [torch.stack(ts).mean(0) for ts in zip(*(v.own_trajectory()[last] for v in views))]
    models = {
        "victim": model_with_parameters(model, view0.own_trajectory()[last]),
        "reconstruction": model_with_parameters(model, reconstruct(view1, 0)[last]),
        "observer": model_with_parameters(model, view1.own_trajectory()[last]),
        "average": model_with_parameters(model, average),
    }
    report = membership_inference(models, members, nonmembers)
    for values in report.values():
        assert 0 <= values["auc"] <= 1 and 0 <= values["tpr_at_fpr"] <= 1


# ---- reconstruction --------------------------------------------------------------------------


def test_reconstruction_reads_exact_gossip_off_bit_for_bit(tmp_path):
    results, views = run_views("exact", steps=3, tmp=tmp_path)
    estimates = reconstruct(views[0], 1)
    for step in range(3):
        assert all(torch.equal(e, t) for e, t in zip(estimates[step], results[1]["sent"][step]))


def test_reconstruction_is_exact_for_full_rank_powergossip(tmp_path):
    results, views = run_views("powergossip:rank=6,min_compression_rate=0", steps=4, tmp=tmp_path)
    truth = {step: sent for step, sent in enumerate(results[3]["sent"])}
    errors = reconstruction_errors(views[0], 3, truth, window=1)
    assert errors["steps"] == [0, 1, 2, 3]
    assert max(errors["estimate"]) < 1e-10  # right and left half-steps alike (square factors)
    assert min(errors["trivial"]) > 1e-3


def test_low_rank_powergossip_reconstruction_beats_the_trivial_estimate(tmp_path):
    results, views = run_views("powergossip:rank=1", steps=6, tmp=tmp_path)
    truth = dict(enumerate(results[1]["sent"]))
    errors = reconstruction_errors(views[0], 1, truth, window=4)
    assert all(e < t for e, t in zip(errors["estimate"], errors["trivial"]))
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        reconstruct(views[0], 1, window=0)
    with pytest.raises(ValueError, match="not a neighbour"):
        reconstruct(views[0], 2)


@pytest.mark.parametrize(
    "spec", ["choco:compressor=identity,gamma=0.5", "deepsqueeze:compressor=identity,gamma=0.5"]
)
def test_public_estimates_are_the_model_with_the_identity_compressor(spec, tmp_path):
    results, views = run_views(spec, steps=4, tmp=tmp_path)
    estimates = reconstruct(views[2], 1)
    for step in range(4):
        assert relative_error(estimates[step], results[1]["sent"][step]) < 1e-12


def test_compressed_public_estimates_are_closer_than_the_trivial_one(tmp_path):
    results, views = run_views("choco:compressor=topk:0.3,gamma=0.3", steps=6, tmp=tmp_path)
    errors = reconstruction_errors(views[0], 1, dict(enumerate(results[1]["sent"])))
    assert errors["estimate"][-1] < errors["trivial"][-1]


def test_choco_reconstruction_needs_every_step(tmp_path):
    _, views = run_views(
        "choco:compressor=topk:0.3,gamma=0.3", steps=3, observe_every=2, tmp=tmp_path
    )
    with pytest.raises(ValueError, match="observe_every=1"):
        reconstruct(views[0], 1)


def test_trivial_estimate_is_the_observers_own_model(tmp_path):
    results, views = run_views("exact", steps=2, tmp=tmp_path)
    own = trivial_estimates(views[0])
    assert all(torch.equal(a, b) for a, b in zip(own[1], results[0]["sent"][1]))
    assert relative_error(own[1], own[1]) == 0.0


# ---- membership inference ----------------------------------------------------------------------


def test_auc_and_tpr_on_hand_computed_scores():
    assert auc([3, 4], [1, 2]) == 1.0 and auc([1, 2], [3, 4]) == 0.0
    assert auc([1, 3], [2, 2]) == 0.5 and auc([2], [2]) == 0.5  # ties count one half
    others = list(range(100))  # threshold at 1 % FPR: the second-largest non-member score, 98
    assert tpr_at_fpr([99, 98.5, 50, 10], others, fpr=0.01) == 0.5
    assert null_auc_std(1000, 1000) == pytest.approx(math.sqrt(2001 / 12e6))


def _blobs(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 20, generator=generator), torch.randint(0, 4, (n,), generator=generator)


def test_loss_auc_is_high_for_an_overfitted_model_and_chance_for_an_unseen_one():
    members, nonmembers = _blobs(40, 1), _blobs(40, 2)  # random labels: only memorising helps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(300):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(members[0]), members[1]).backward()
        optimizer.step()
    overfitted = loss_attack(model, members, nonmembers)
    assert overfitted["auc"] > 0.9 and overfitted["tpr_at_fpr"] > 0.2

    fresh = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    big_in, big_out = _blobs(2000, 3), _blobs(2000, 4)
    unseen = loss_attack(fresh, big_in, big_out)["auc"]
    assert abs(unseen - 0.5) < 4 * null_auc_std(2000, 2000)


def test_model_with_parameters_refuses_another_models_parameters():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="parameter tensors"):
        model_with_parameters(model, [torch.zeros(2, 3)])
    copied = model_with_parameters(model, [torch.ones(2, 3), torch.zeros(2)])
    assert torch.equal(copied.weight, torch.ones(2, 3)) and not torch.equal(
        model.weight, copied.weight
    )


# ---- under mpiexec -------------------------------------------------------------------------------


@pytest.mark.mpi
def test_recording_works_under_mpiexec_and_matches_the_local_run(tmp_path):
    spec, steps = "powergossip:rank=2", 3
    mpi_dir, local_dir = tmp_path / "mpi", tmp_path / "local"
    mpi_dir.mkdir()
    results = run_scenario_mpi(
        4,
        "privacy_attack_scenarios:mpi_observed_gossip",
        "ring:4",
        mpi_dir,
        extra=(mpi_dir, spec, steps),
    )
    local = LocalCluster(RING).run(observed_gossip, spec, steps, "3", local_dir)
    for a, b in zip(results, local):
        assert all(torch.equal(x, y) for x, y in zip(a["final"], b["final"]))
    assert [observed_dir(mpi_dir, k).exists() for k in range(4)] == [False, False, False, True]
    mpi_view, local_view = (
        load_view(observed_dir(mpi_dir, 3)),
        load_view(observed_dir(local_dir, 3)),
    )
    assert mpi_view.meta == local_view.meta and mpi_view.steps == local_view.steps == [0, 1, 2]
    for a, b in zip(mpi_view.records, local_view.records):
        for x, y in zip(a["messages"], b["messages"]):
            assert (x["sender"], x["kind"]) == (y["sender"], y["kind"])
            assert torch.equal(x["tensor"], y["tensor"])
            assert all(torch.equal(x["factors"][g], y["factors"][g]) for g in x["factors"])


# ---- the membership protocol: held-out split ------------------------------------------------------

from gossip_powersgd.privacy.heldout import make_split  # noqa: E402
from gossip_powersgd.privacy.membership import (  # noqa: E402
    attack_report,
    class_prior_scores,
    null_band,
    per_class_auc,
    roc_curve,
)

SPLIT_DATA = "synthetic_logreg:d=8,classes=4,n=800"


def test_split_members_and_heldout_are_disjoint_and_cover_the_victims_shard():
    from gossip_powersgd.training.data import load_dataset, partition

    split = make_split(
        SPLIT_DATA, 4, "dirichlet:0.5", seed=3, victims=[1, 3], fraction=0.5, split_seed=7
    )
    shards = partition(load_dataset(SPLIT_DATA, 3).y_train, 4, "dirichlet:0.5", 3)
    for rank in range(4):
        members, heldout = set(split.members[rank]), set(split.heldout[rank])
        assert not members & heldout
        assert members | heldout == set(shards[rank].tolist())
        assert len(heldout) == (round(0.5 * len(shards[rank])) if rank in (1, 3) else 0)
    assert split.victims == (1, 3)
    record = split.record()  # the audit record holds the seeds and every index
    assert record["split_seed"] == 7 and record["heldout"]["1"] == split.heldout[1].tolist()
    assert make_split(SPLIT_DATA, 4, "dirichlet:0.5", 3, [1, 3], 0.5, 7).key() == split.key()
    with pytest.raises(ValueError, match="not ranks of a 4-peer run"):
        make_split(SPLIT_DATA, 4, "iid", 0, victims=[4])


def test_heldout_class_mix_matches_the_shard_in_expectation():
    """Over many split seeds the held-out count of each class averages h n_c / n (hypergeometric
    mean); the tolerance is 4 standard errors of the mean of the hypergeometric counts."""
    from gossip_powersgd.training.data import load_dataset

    y = load_dataset(SPLIT_DATA, 0).y_train.numpy()
    seeds = 200
    counts = []
    for s in range(seeds):
        split = make_split(
            SPLIT_DATA, 4, "dirichlet:0.5", 0, victims=[2], fraction=0.3, split_seed=s
        )
        counts.append(np.bincount(y[split.heldout[2]], minlength=4))
    shard = np.r_[split.members[2], split.heldout[2]]
    n, h = len(shard), len(split.heldout[2])
    share = np.bincount(y[shard], minlength=4) / n
    expected = h * share
    sd = np.sqrt(h * share * (1 - share) * (n - h) / (n - 1))
    assert np.all(np.abs(np.mean(counts, axis=0) - expected) <= 4 * sd / np.sqrt(seeds) + 1e-12)


def test_no_peer_ever_trains_on_a_held_out_record():
    """Through the training data path: every peer's batches (what its loop samples from) hold
    exactly its members, and no held-out row of any victim."""
    from gossip_powersgd.training.hooks import TrainingHooks

    split = make_split(SPLIT_DATA, 4, "iid", seed=0, victims=[0, 1], fraction=0.5, split_seed=1)
    seen = {}

    class Capture(TrainingHooks):
        name = "capture"

        def setup(self, context):
            self.context = context

        def after_step(self, step, loss):
            seen.setdefault(self.context.comm.rank, self.context.batches.x.clone())

    config = tiny(
        dataset=split.spec(), partition="local", release_peer_statistics=True, model="logreg"
    )
    train_all(config, Capture)
    held = torch.cat([split.heldout_set(v)[0] for v in split.victims])
    for rank in range(4):
        x = seen[rank]
        assert torch.equal(x, split.member_set(rank)[0])
        assert not (x[:, None, :] == held[None, :, :]).all(-1).any()


def test_the_class_prior_score_is_at_chance_on_a_heldout_split_not_on_test_samples():
    """The blind baseline: under a skewed shard the class-prior score separates the shard from
    uniform test samples, but not from a random held-out part of the same shard."""
    from gossip_powersgd.training.data import load_dataset

    split = make_split(SPLIT_DATA, 4, "dirichlet:0.3", seed=0, victims=[1], split_seed=0)
    data = load_dataset(SPLIT_DATA, 0)
    members, heldout = split.member_set(1)[1], split.heldout_set(1)[1]
    prior = lambda y: class_prior_scores(y, members, 4)  # noqa: E731
    band = null_band(prior(members), prior(heldout), permutations=200)
    assert band["auc"][0] <= auc(prior(members), prior(heldout)) <= band["auc"][1]
    test = data.y_test[: len(heldout)]
    assert auc(prior(members), prior(test)) > band["auc"][1]


def test_tpr_at_a_fixed_fpr_has_the_known_answer():
    # 1000 non-members 0..999; half the members above all of them: TPR at 0.1 % FPR is 1/2.
    others = np.arange(1000.0)
    members = np.r_[np.full(50, 2000.0), np.arange(50.0)]
    assert tpr_at_fpr(members, others, 0.001) == 0.5
    # Gaussians N(mu, 1) vs N(0, 1): TPR(f) = 1 - Phi(Phi^-1(1 - f) - mu). With 20 000 members,
    # the threshold's sampling error shifts it by ~sqrt(f(1-f)/k)/phi(z) and the member count adds
    # sqrt(p(1-p)/m): 5 combined standard errors bound it.
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    k = m = 20000
    mu, f = 2.0, 0.01
    out, inside = rng.standard_normal(k), rng.standard_normal(m) + mu
    z = norm.ppf(1 - f)
    p = 1 - norm.cdf(z - mu)
    se = np.sqrt(p * (1 - p) / m) + norm.pdf(z - mu) * np.sqrt(f * (1 - f) / k) / norm.pdf(z)
    assert abs(tpr_at_fpr(inside, out, f) - p) < 5 * se
    report = attack_report(inside, out, np.zeros(m), np.zeros(k))
    assert report["tpr"][1] == tpr_at_fpr(inside, out, 0.01)
    assert report["auc"] == pytest.approx(norm.cdf(mu / np.sqrt(2)), abs=5 * null_auc_std(m, k))
    fpr, tpr = roc_curve([3, 2], [1, 2])
    assert fpr.tolist() == [0, 0, 0.5, 1] and tpr.tolist() == [0, 0.5, 1, 1]
    assert per_class_auc([3, 0], [1, 1], [0, 1], [0, 1]) == {0: 1.0, 1: 0.0}


# ---- LiRA ---------------------------------------------------------------------------------------


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


# ---- least squares on the model difference ----------------------------------------------------


def test_difference_estimate_is_exact_at_full_rank_and_never_beats_its_oracle(tmp_path):
    from gossip_powersgd.privacy.estimators import difference_estimates, oracle_estimates

    results, views = run_views("powergossip:rank=6,min_compression_rate=0", steps=4, tmp=tmp_path)
    truth = dict(enumerate(results[3]["sent"]))
    # One square factor determines D exactly: the error is float64 round-off of a 6 x 6 solve.
    for step, estimate in difference_estimates(views[0], 3, steps=[0, 1, 2, 3], window=1).items():
        assert relative_error(estimate, truth[step]) < 1e-10
    results, views = run_views("powergossip:rank=1", steps=8, tmp=tmp_path / "r1")
    truth = dict(enumerate(results[1]["sent"]))
    steps = [3, 5, 7]
    for window in (2, 8):
        lsq = difference_estimates(views[0], 1, steps=steps, window=window)
        oracle = oracle_estimates(views[0], 1, truth, steps=steps, window=window)
        for s in steps:
            # The least-squares D is zero exactly where the oracle drops the truth (the directions
            # no factor measured) and the oracle is exact on the rest: an orthogonal split, so the
            # oracle's error is a lower bound up to round-off.
            assert relative_error(oracle[s], truth[s]) <= relative_error(lsq[s], truth[s]) + 1e-12
    with pytest.raises(ValueError, match="forget must lie in"):
        difference_estimates(views[0], 1, forget=0)
    with pytest.raises(ValueError, match="PowerGossip views"):
        difference_estimates(run_views("exact", steps=1, tmp=tmp_path / "e")[1][0], 1)


def test_difference_estimate_of_a_static_difference_is_exact_once_the_factors_span_it(tmp_path):
    """When the difference is constant the window's measurements are consistent: once the
    factors span the space (8 half-steps of rank 1 for a 6 x 6 with random factors) the
    least squares returns D exactly, wherever both models move (the observer's own history
    removes the common motion)."""
    from gossip_powersgd.privacy.estimators import difference_estimates

    results, views = run_views("powergossip:rank=1", steps=12, tmp=tmp_path)
    view = views[0]
    own = view.own_trajectory()
    shift = [
        torch.randn(t.shape, generator=torch.Generator().manual_seed(9), dtype=t.dtype)
        for t in own[0]
    ]
    # Rewrite the recorded messages as those of a neighbour at the observer's model + shift.
    for record in view.records:
        for m in record["messages"]:
            if m["sender"] != 1:
                continue
            neighbour = [a + b for a, b in zip(record["own"], shift)]
            blocks = []
            for g, (indices, rows, cols, r) in enumerate(view.meta["groups"]):
                mats = torch.stack([neighbour[k].reshape(rows, cols) for k in indices])
                f = m["factors"][str(g)]
                blocks.append(
                    (mats @ f).transpose(1, 2) if m["kind"] == "right" else f.transpose(1, 2) @ mats
                )
            exact = [neighbour[k].reshape(-1) for k in view.meta["exact_indices"]]
            m["tensor"] = torch.cat([b.reshape(-1) for b in blocks] + exact)
    last = view.steps[-1]
    estimate = difference_estimates(view, 1, steps=[last], window=12)[last]
    truth = [a + b for a, b in zip(own[last], shift)]
    assert relative_error(estimate, truth) < 1e-8  # float64 solve of well-conditioned 6 x 6 sums


# ---- the attacks of a run, with their blind baselines (gossip_powersgd.privacy.attacks) ---------


def test_candidates_pool_each_victims_members_and_heldout_records():
    from gossip_powersgd.privacy.attacks import Candidates

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=2)
    pool = Candidates.of(split)
    for v in (1, 3):
        mine = pool.victim == v
        assert pool.member[mine].sum() == len(split.members[v])
        assert (~pool.member[mine]).sum() == len(split.heldout[v])
    x1, _ = split.heldout_set(1)
    assert torch.equal(pool.x[(pool.victim == 1) & ~pool.member], x1)
    only = Candidates.of(split, victims=[3])  # a split may hold out more peers than are attacked
    assert set(only.victim.tolist()) == {3} and len(only.y) == len(split.members[3]) * 2


def test_null_band_of_depends_on_the_counts_alone_and_narrows_with_them():
    """The central 95 % of the AUC under random labels is about +-1.96 null sds around 1/2. Its
    ends are quantiles of 400 permutations: each within ~4 standard errors, sqrt(0.025 * 0.975 /
    400) / phi(1.96) = 0.135 sd, of the true one, so the width within 1.1 sd of 3.92 sd (28 %)."""
    from gossip_powersgd.privacy.attacks import null_band_of

    for m, n in ((50, 50), (2000, 1000)):
        band = null_band_of(m, n)
        assert null_band_of(m, n) is band  # computed once per counts
        assert band["auc"][0] < 0.5 < band["auc"][1]
        width = band["auc"][1] - band["auc"][0]
        assert width == pytest.approx(3.92 * null_auc_std(m, n), rel=0.28)


def test_an_observed_exact_gossip_run_reads_the_victims_model_off_and_attacks_it_alike(tmp_path):
    """exact gossip sends the model itself: what the observer reads off at a snapshot step is
    the victim's parameters bit for bit (relative L2 error 0, agreement 1), so every attack
    through it scores exactly as through the victim's own model; the blind baselines and the
    null band are reported beside them."""
    from gossip_powersgd.privacy.attack_run import neighbour_report, observe
    from gossip_powersgd.privacy.attacks import Candidates, References, flat

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    config = dict(topology="ring:4", model="logreg", epochs=2, batch_size=16, lr=0.2, seed=0)
    config.update(algorithm="exact", quiet=True, log_every=0, checkpoint_every=0, out_dir=None)
    config["release_peer_statistics"] = True  # partition: local sizes an epoch from the shards
    run = observe(config, split, observer=0, fractions=(0.5, 1.0))
    assert len(run.steps) == 2 and set(run.snapshots) == {0, 1, 2, 3}
    assert run.observed_bytes > 0 and run.view.meta["observer"] == 0
    data = split.data()

    def make():
        return build_model("logreg", data.input_shape, data.num_classes, 0)

    recipe = dict(epochs=2, lr=0.2, batch=16)
    refs = References.build(split, Candidates.of(split), 0, make, 2, recipe, seed=0)
    report = neighbour_report(run, split, 0, refs, make, data.x_test)
    assert list(report) == [str(s) for s in run.steps]
    last = report[str(run.steps[-1])]
    values = last["flat"]
    for attack in ("LOSS", "LiRA offline", "LiRA online"):
        assert values[f"auc/read off / public copy/{attack}"] == values[f"auc/victim/{attack}"]
    assert last["quality"]["read off / public copy"] == {"l2": 0.0, "agreement": 1.0}
    assert {"observer's own", "average of all"} <= set(last["evaluation"]["models"])
    assert "roc" in last["evaluation"]["models"]["victim"]["LiRA offline"]
    band = last["evaluation"]["null_band"]
    assert band["auc"][0] < 0.5 < band["auc"][1] and flat(last["evaluation"]) == values
    # the class prior never looks at a model: members and held-out records of one shard, chance
    pool = Candidates.of(split)
    members = int(pool.member.sum())
    assert abs(values["auc/class prior"] - 0.5) < 4 * null_auc_std(members, len(pool.y) - members)


def test_non_finite_attack_scores_are_refused_naming_the_count():
    from gossip_powersgd.privacy import auc, loss_attack
    from gossip_powersgd.privacy.membership import tpr_at_fpr

    nan = float("nan")
    with pytest.raises(
        ValueError,
        match=r"^3 of 3 member scores are not finite \(NaN or infinite\): "
        r"the model has likely diverged",
    ):
        auc([nan] * 3, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"^1 of 2 non-member scores are not finite"):
        tpr_at_fpr([0.0, 1.0], [float("inf"), 1.0])
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight[0, 0] = nan  # every sample's logits, hence every loss, become NaN
    x, y = torch.ones(5, 4), torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError) as info:
        loss_attack(model, (x, y), (x, y))
    assert str(info.value) == (
        "5 of 5 member scores are not finite (NaN or infinite): the model "
        "has likely diverged (check its parameters for NaN/inf); no attack "
        "score is meaningful for it"
    )
