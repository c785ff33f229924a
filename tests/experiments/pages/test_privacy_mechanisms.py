"""experiments/pages/privacy_mechanisms: the calibration keeps only the bounds valid for the run's
schedule, the plan calibrates each topology before its runs, the budget page's verdict, and
properties of the committed runs (each attacked, a balanced AUC, what exact gossip sends)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from experiments.engine import RowFile
from experiments.pages import privacy_mechanisms as mechanisms
from experiments.pages import privacy_mechanisms_budget as budget
from experiments.pages.privacy_mechanisms import audited
from experiments.pages.privacy_mechanisms import runs as mechanism_runs

RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"


def test_calibration_keeps_only_the_bounds_valid_for_training():
    """The network bounds are no guarantee for training (adaptive gradients, the evaluation's
    release: `muffliato.NETWORK_LABEL`), at a constant lr as under a cosine one: Muffliato and
    ZIP-DL report DP-SGD's local bound at DP-SGD's sigma; DP-SGD's and DECOR's noise is on the
    gradient, so their sigma and epsilon are the constant schedule's, bit for bit."""
    setting = mechanisms.setting_of("ring:4", True)
    assert setting["schedule"] == "constant"
    constant = mechanism_runs.calibrate(setting)
    cosine = mechanism_runs.calibrate(dict(setting, schedule="cosine"))
    for name in ("muffliato", "zipdl"):
        assert "network_neighbour" not in constant[name]
        assert "no guarantee for training" in constant[name]["note"]
    for name in ("local", "decor"):
        for key in ("sigma", "neighbour", "far", "neighbour_pld", "local"):
            assert cosine[name][key] == constant[name][key]
    local = cosine["local"]
    for name in ("muffliato", "zipdl"):
        row = cosine[name]
        assert "network_neighbour" not in row and "lr is cosine" in row["note"]
        assert row["sigma"] == local["sigma"] and row["neighbour"] == local["neighbour"]
        assert row["far"] == local["far"] and row["local"] == local["local"]
    # ZIP-DL's zero-sum std: rho = 1 times one step's DP noise on the model at the base lr
    expected = setting["lr"] * local["sigma"] * mechanism_runs.CLIP / setting["batch_size"]
    assert cosine["zipdl"]["zipdl_sigma"] == pytest.approx(
        expected * mechanism_runs.ZIPDL_RATIO, rel=1e-12
    )


def test_the_plan_calibrates_each_topology_before_its_runs_and_reuses_dpsgds_for_muffliato():
    first = mechanisms.plan(False, {})
    assert [r.key for r in first] == [f"calibration/{t}" for t in mechanisms.TOPOLOGIES]
    local = {"sigma": 6.8, "steps": 8192}
    rows = {r.key: {"local": local, "muffliato": local, "zipdl": {}, "decor": {}} for r in first}
    runs = mechanisms.plan(False, rows)[1:]
    ring8 = [r for r in runs if r.key.startswith("ring:8/")]
    # non-private, local, zipdl, decor per algorithm (Muffliato's noise is DP-SGD's: its runs)
    assert len(ring8) == 2 * 4 * 3 and not any("muffliato" in r.key for r in ring8)
    assert all(r.config["noise"] is local for r in ring8 if r.config["mechanism"] == "local")
    rows["calibration/ring:8"] = dict(rows["calibration/ring:8"], muffliato={"sigma": 5.0})
    assert sum("ring:8/muffliato" in r.key for r in mechanisms.plan(False, rows)) == 2 * 3


def _budget_rows(epochs, accs, mechanism="local", topology="ring:8"):
    return [
        dict(
            topology=topology,
            mechanism=mechanism,
            algorithm="exact gossip",
            seed=s,
            epochs=epochs,
            acc_avg=a,
        )
        for s, a in enumerate(accs)
    ]


@pytest.mark.parametrize(
    "short, long, expected",
    [
        ([0.870, 0.875, 0.880], [0.872, 0.877, 0.878], 128),  # +0.07 pp: no doubling pays
        ([0.870, 0.875, 0.880], [0.900, 0.905, 0.910], None),  # +3 pp, sd 0.5: it pays
        ([0.870], [0.900], None),  # one seed: no spread, no plateau shown
    ],
)
def test_the_mechanisms_budget_verdict(short, long, expected):
    rows = _budget_rows(128, short) + _budget_rows(128, [0.9], "none")
    rows += _budget_rows(256, long) + _budget_rows(256, [0.95], "none")
    table = budget.cells(rows)
    assert budget.verdicts(table) == {"ring:8": expected}
    (step,) = budget.doublings(table[("ring:8", "local", "exact gossip")])
    assert step["gain"] == pytest.approx(100 * (sum(long) / len(long) - sum(short) / len(short)))


def test_the_committed_budget_page_is_the_verdict_of_its_rows():
    rows = [r.row for r in RowFile(RESULTS / "privacy_mechanisms_budget.jsonl").read().values()]
    runs = [r for r in rows if "acc_avg" in r]  # the calibrations have none
    assert {r["epochs"] for r in runs} == {128, 256, 512, 1024}
    verdicts = budget.verdicts(budget.cells(runs))
    assert verdicts == {"ring:8": 256, "ring:16": 256, "exponential:16": 512}
    page = (RESULTS / "privacy_mechanisms_budget.md").read_text()
    assert "- **exponential:16**: **512 epochs**: no private row gains clearly" in page


def test_every_committed_run_is_attacked_with_a_balanced_auc_and_exact_gossip_sends_the_model():
    records = RowFile(RESULTS / "privacy_mechanisms_logreg.jsonl").read().values()
    rows = [r.row for r in records if r.config["kind"] == "run"]
    assert len(rows) == 3 * 2 * 4 * 3  # topologies, algorithms, mechanisms but Muffliato, seeds
    for row in rows:
        for key in ("auc/received/LOSS", "auc/victim's own/LOSS", "auc/blind model/LOSS"):
            assert 0.0 <= row[key] <= 1.0
        assert row["members"] == row["nonmembers"] > 0  # a balanced AUC
        assert not math.isnan(row["acc_half"]) and not math.isnan(row["acc_3q"])
        if row["algorithm"] == "exact gossip" and row["mechanism"] in ("none", "local", "decor"):
            # exact gossip sends the model itself (no noise on the wire for these): the observer's
            # received model is the victim's, so the two attacks score identically
            assert row["auc/received/LOSS"] == row["auc/victim's own/LOSS"]
        if row["algorithm"] == "exact gossip" and row["mechanism"] == "zipdl":
            # ZIP-DL's zero-sum noise is on the message only: what is received is not the model
            assert row["auc/received/LOSS"] != row["auc/victim's own/LOSS"]
    page = (RESULTS / "privacy_mechanisms_logreg.md").read_text()
    # every placeholder of the page's text was filled (an f-string prefix once went missing)
    assert not re.search(r"\{[A-Za-z_][A-Za-z_0-9.\[\]'\"]*(\(|\})", page)
    # under a decaying lr the last quarter's rise is no plateau test: the page draws no verdict
    plateau = page.split("## Trained to a plateau?")[1].split("\n## ")[0]
    assert "however long the run" in plateau and "privacy_mechanisms_budget.md" in plateau
    assert "plateau at this measure" not in plateau and "**not** shown" not in plateau


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
