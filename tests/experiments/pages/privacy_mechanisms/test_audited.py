"""experiments/pages/privacy_mechanisms/audited.py: the audited calibration is at the victim's rate
and the runs' steps; the audited plan runs privacy_attacks' non-private config at the calibrated
noise; every committed audited run is attacked and audited with its calibration."""

from __future__ import annotations

import math
import re

from experiments.engine import RowFile
from experiments.pages.privacy_mechanisms import audited

from tests.experiments.pages.privacy_mechanisms._support import RESULTS


def test_the_audited_calibration_is_at_the_victims_rate_and_the_runs_steps():
    """The victims train on their members (half a shard) at q = batch / members for the run's
    steps (an epoch: the public total over the peers, as training/setup.py counts it); with the
    included canaries a victim holds more records, so its real rate is lower and its epsilon at
    the calibrated sigma below the claim (the claim is an upper bound)."""
    from gossip_powersgd.privacy.mechanisms.calibration import subsampled_epsilon

    setting = audited.calibration_setting(True)
    noises = audited.calibrate(setting)
    public = noises["public"]
    assert public["members"] * 4 == public["train_size"] // 2  # 4 peers, half a shard each
    local = noises["local"]
    assert local["q"] == setting["batch_size"] / public["members"]
    per_epoch = math.ceil(public["train_size"] / (public["peers"] * setting["batch_size"]))
    assert local["steps"] == setting["epochs"] * per_epoch
    assert local["neighbour"] <= audited.TARGET
    with_canaries = setting["batch_size"] / (public["members"] + 16)
    below = subsampled_epsilon(local["sigma"], with_canaries, local["steps"], setting["dp_delta"])
    assert below < local["neighbour"]


def test_the_audited_plan_runs_privacy_attacks_non_private_config_and_calibrated_noise():
    """Calibration and splits first; then seed 0's runs before the others'; the non-private
    runs are privacy_attacks.md's config (the same figures), the private ones its DP recipe with
    each mechanism's calibrated noise, no peer statistic released and the public total declared;
    Muffliato is not run where its noise is DP-SGD's."""
    from experiments.pages.privacy_attacks import runs as attack_runs

    first = audited.plan(False, {})
    assert [r.key for r in first] == ["calibration"] + [f"split/seed{s}" for s in (0, 1, 2)]
    noises = audited.calibrate(audited.calibration_setting(False))
    runs = audited.plan(False, {"calibration": noises})[4:]
    assert len(runs) == 3 * 2 * 4  # seeds, algorithms, mechanisms but Muffliato
    assert [r.seed for r in runs] == sorted(r.seed for r in runs)
    attack_plan = {r.key: r.config for r in attack_runs.plan("privacy_attacks", False, {})}
    for run in runs:
        c, train = run.config, run.config["train"]
        assert c["canaries"] == 256 and c["reference"]["kind"] == "gossip"
        if c["mechanism"] == "none":
            theirs = attack_plan[attack_runs.key(c["spec"], None, run.seed)]
            assert train == theirs["train"] and c["reference"] == theirs["reference"]
            continue
        noise = noises[c["mechanism"]]
        assert train["release_peer_statistics"] is False and "dp_target_epsilon" not in train
        assert train["public_train_size"] == noises["public"]["train_size"]
        assert train["dp_noise_multiplier"] == noise["sigma"]
        assert train.get("dp_decor_sigma_cor") == noise.get("sigma_cor")
        assert train.get("dp_zipdl_sigma") == noise.get("zipdl_sigma")
        assert train["epochs"] * 16 == noise["steps"]  # 4000 records per peer, batches of 256
    assert not any(r.config["mechanism"] == "muffliato" for r in runs)


def test_every_committed_audited_run_is_attacked_and_audited_with_its_calibrated_noise():
    """privacy_mechanisms.md's rows: every (mechanism but Muffliato, algorithm, seed) attacked on
    balanced candidates and audited through the observer, the victim and the blind model; every
    private run trained with its calibrated sigma for the calibration's steps (the claim's);
    exact gossip sends the model itself where no noise is added to the message, so the
    observer's attack and audit are the victim's own."""
    from gossip_powersgd.privacy.audit import audit_ceiling

    records = list(RowFile(RESULTS / "privacy_mechanisms.jsonl").read().values())
    noises = next(r.row for r in records if r.key == "calibration")
    rows = [r.row for r in records if r.config["kind"] == "attack"]
    assert len(rows) == 3 * 2 * 4
    for row in rows:
        assert row["members"] == row["nonmembers"] > 0
        audit = row["audit"]
        ceiling = audit_ceiling(audit["m"], audit["counts"], audit["delta"], audit["confidence"])
        for source in ("observer", "victim", "blind model"):
            assert 0.0 <= audit[source]["epsilon"] <= ceiling
        if row["mechanism"] != "none":
            noise = noises[row["mechanism"]]
            assert row["steps"] == noise["steps"] and row["sigma"] == noise["sigma"]
        if row["algorithm"] == "exact gossip" and row["mechanism"] in ("none", "local", "decor"):
            assert row["auc/received/LOSS"] == row["auc/victim's own/LOSS"]
            assert audit["observer"] == audit["victim"]
    page = (RESULTS / "privacy_mechanisms.md").read_text()
    assert not re.search(r"\{[A-Za-z_][A-Za-z_0-9.\[\]'\"]*(\(|\})", page)
