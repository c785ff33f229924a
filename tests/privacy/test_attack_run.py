"""`privacy.attack_run`: an observed run and the neighbour's report — what the observer reads off
exact gossip is the victim's model, attacked alike, beside the blind baselines."""

from __future__ import annotations

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
