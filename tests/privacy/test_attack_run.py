"""`privacy.attack_run`: an observed run and the neighbour's report — what the observer reads off
exact gossip is the victim's model, attacked alike, beside the blind baselines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossip_powersgd.privacy.heldout import make_split
from gossip_powersgd.privacy.membership import null_auc_std
from gossip_powersgd.training.models import build_model
from privacy_attack_scenarios import SPLIT_DATA


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


def test_snapshots_with_local_steps_are_taken_at_the_views_gossip_steps():
    """local_steps 2: the view numbers gossip steps (0..7 of 16 optimizer steps), and the truth
    an estimate is judged against must be the victim's parameters at that same gossip step, so
    what the observer reads off exact gossip equals it bit for bit at every snapshot step (it
    was the parameters of optimizer step 3 against the model sent at gossip step 3, 0.18 apart,
    and the last snapshot step, 15, was no step of the view)."""
    from gossip_powersgd.privacy.attack_run import READ_OFF, observe, reconstructions

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    config = dict(topology="ring:4", model="logreg", epochs=2, batch_size=16, lr=0.2, seed=0)
    config.update(algorithm="exact", quiet=True, log_every=0, checkpoint_every=0, out_dir=None)
    config.update(release_peer_statistics=True, local_steps=2)
    run = observe(config, split, observer=0, fractions=(0.25, 0.5, 1.0))
    assert run.result.summary["steps"] == 16 and run.view.steps == list(range(8))
    assert run.steps == [1, 3, 7]
    estimates = reconstructions(run.view, [1, 3], run.steps)
    for step in run.steps:
        for victim in (1, 3):
            read = estimates[step][READ_OFF][victim]
            assert all(torch.equal(a, b) for a, b in zip(read, run.snapshots[victim][step]))


def test_recheck_audit_is_best_audit_on_the_stored_scores_and_truth():
    from gossip_powersgd.privacy.attack_run import recheck_audit
    from gossip_powersgd.privacy.audit import CONFIDENCE, audit_counts, best_audit

    rng = np.random.default_rng(0)
    truth = rng.random(200) < 0.5
    scores = truth * 3.0 + rng.standard_normal(200)  # a strong signal: a bound > 0
    result = best_audit(scores, truth, 1e-5, audit_counts(200), CONFIDENCE)
    row = {"included": truth.astype(int).tolist(), "delta": 1e-5, "m": 200}
    row.update(confidence=CONFIDENCE, counts=[list(c) for c in audit_counts(200)])  # as JSON
    row["victim"] = {"epsilon": result.epsilon, "scores": scores.tolist()}
    assert recheck_audit(row, "victim") == result.epsilon > 0
    row["victim"]["scores"] = rng.standard_normal(200).tolist()  # no signal: another figure
    assert recheck_audit(row, "victim") != result.epsilon


def test_a_run_with_canaries_is_audited_through_the_observer_and_the_victims_model():
    """Two victims' canaries pooled: the record's truth is the hooks' coins, its counts the
    default ones for the pooled m, and each source's bound is `best_audit` on its stored scores
    (checked again from the record, as a reader of the JSON would)."""
    from gossip_powersgd.privacy.attack_run import canary_audit, observe, recheck_audit
    from gossip_powersgd.privacy.audit import audit_counts
    from gossip_powersgd.privacy.canaries import canary_hooks

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    data = split.data()
    hooks = canary_hooks(split.victims, data, 32, seed=0)
    config = dict(topology="ring:4", model="logreg", epochs=2, batch_size=16, lr=0.2, seed=0)
    config.update(algorithm="exact", quiet=True, log_every=0, checkpoint_every=0, out_dir=None)
    config["release_peer_statistics"] = True
    run = observe(config, split, observer=0, fractions=(1.0,), hooks=hooks)

    def make():
        return build_model("logreg", data.input_shape, data.num_classes, 0)

    record = canary_audit(hooks, run, make, make(), 1e-5)
    truth = np.concatenate([h.included.numpy() for h in hooks])
    assert record["included"] == truth.astype(int).tolist() and record["m"] == 64
    assert record["counts"] == audit_counts(64)
    assert "blind model" not in record  # no blind model given: no baseline
    for source in ("observer", "victim"):
        assert len(record[source]["scores"]) == 64 and record[source]["m"] == 64
        assert recheck_audit(record, source) == record[source]["epsilon"] >= 0
    # The blind baseline scores through the model it is given: the public initial model itself
    # drops no canary's loss (each score is its loss minus the same loss, exactly 0).
    blind = canary_audit(hooks, run, make, make(), 1e-5, blind=make())
    assert blind["blind model"]["scores"] == [0.0] * 64
    assert recheck_audit(blind, "blind model") == blind["blind model"]["epsilon"]
    assert blind["victim"] == record["victim"]


@pytest.fixture(scope="module")
def exact_run():
    """An observed exact-gossip run on ring:4 (victims 1 and 3), its split, its model maker and
    LiRA references (2 models)."""
    from gossip_powersgd.privacy.attack_run import observe
    from gossip_powersgd.privacy.attacks import Candidates, References

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    config = dict(topology="ring:4", model="logreg", epochs=2, batch_size=16, lr=0.2, seed=0)
    config.update(algorithm="exact", quiet=True, log_every=0, checkpoint_every=0, out_dir=None)
    config["release_peer_statistics"] = True
    run = observe(config, split, observer=0, fractions=(1.0,))
    data = split.data()

    def make():
        return build_model("logreg", data.input_shape, data.num_classes, 0)

    candidates = Candidates.of(split)
    refs = References.build(split, candidates, 0, make, 2, dict(epochs=2, lr=0.2, batch=16), 0)
    return run, split, make, candidates, refs


def test_the_received_attack_on_exact_gossip_is_the_attack_on_the_victims_own_model(exact_run):
    """exact gossip sends the model: what the observer received at the last step is each
    victim's model there, so every attack scores the same through both; the null band and the
    candidates' counts are reported beside them."""
    from gossip_powersgd.privacy.attack_run import received_attack
    from gossip_powersgd.privacy.attacks import ATTACKS

    run, _, make, candidates, refs = exact_run
    out = received_attack(run.view, run.snapshots, candidates, refs, make)
    for attack in ATTACKS:
        assert out[f"auc/received/{attack}"] == out[f"auc/victim's own/{attack}"]
    assert out["null/auc"][0] < 0.5 < out["null/auc"][1]
    assert (out["members"], out["nonmembers"]) == (
        int(candidates.member.sum()),
        int((~candidates.member).sum()),
    )


def test_the_own_model_loss_attack_is_the_loss_attack_through_the_victims_models(exact_run):
    """The white-box LOSS attack, pooled over the victims, gives exactly what `attacks.evaluate`
    gives for LOSS through the same models (another code path), beside the permutation band of
    its counts; each victim's accuracy is a share of the test set."""
    from gossip_powersgd.privacy.attack_run import own_model_loss_attack, received_attack
    from gossip_powersgd.privacy.attacks import null_band_of

    run, split, make, candidates, refs = exact_run
    loss = own_model_loss_attack(run, split, make)
    out = received_attack(run.view, run.snapshots, candidates, refs, make)
    assert loss["auc"] == out["auc/victim's own/LOSS"]
    assert loss["tpr"] == out["tpr0.1/victim's own/LOSS"]
    assert loss["band"] == null_band_of(loss["members"], loss["nonmembers"])
    assert loss["band"]["auc"][0] < 0.5 < loss["band"]["auc"][1]
    assert (loss["members"], loss["nonmembers"]) == (out["members"], out["nonmembers"])
    assert len(loss["accuracy"]) == 2 and all(0 < a <= 1 for a in loss["accuracy"])


def test_a_victims_accuracy_is_its_own_models_test_accuracy(exact_run):
    """The same figure the trainer's evaluation gives for that model (another code path)."""
    from gossip_powersgd.privacy.attack_run import victim_accuracy
    from gossip_powersgd.privacy.membership import model_with_parameters
    from gossip_powersgd.training.evaluation import evaluate_model

    run, split, make, _, _ = exact_run
    data = split.data()
    accuracy = victim_accuracy(run, [3, 1], make, data.x_test, data.y_test)
    for v, a in zip([3, 1], accuracy):
        model = model_with_parameters(make(), run.snapshots[v][run.steps[-1]])
        assert a == evaluate_model(model, data.x_test, data.y_test)[0]
