"""experiments/pages/privacy_attacks: the plans of both regimes (network section, splits, attacked
runs in the regime's order), the plateau check, the answers (where the neighbour's TPR reaches
chance), the budget check against older rows, and the committed rows' audit record and tables
(no training)."""

from __future__ import annotations

from pathlib import Path

from gossip_powersgd.privacy.attack_run import recheck_audit

from experiments.engine import RowFile
from experiments.pages import privacy_regime as sweep
from experiments.pages._markdown import snippets
from experiments.pages.privacy_attacks import page, regimes, runs, tables

RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"


def test_each_regimes_plan_holds_its_network_section_splits_references_and_attacked_runs():
    plan = runs.plan("privacy_attacks", False, {})
    regime = regimes.REGIMES["privacy_attacks"]
    assert (
        plan[0].key == "network" and plan[0].config["topologies"] == regime["network"]["topologies"]
    )
    assert [r.key for r in plan[1:4]] == ["split/seed0", "split/seed1", "split/seed2"]
    # each seed's gossip-trained references come before that seed's first attacked run
    references = [r for r in plan if r.config["kind"] == "reference"]
    assert [(r.seed, r.config["k"]) for r in references] == [
        (s, k) for s in (0, 1, 2) for k in range(regime["references"])
    ]
    attacked = [r for r in plan if r.config["kind"] == "attack"]
    for ref in references:
        assert plan.index(ref) < min(plan.index(r) for r in attacked if r.seed == ref.seed)
        train = ref.config["reference"]["train"]
        assert train["algorithm"] == "exact" and "dp_target_epsilon" not in train
        assert train["topology"] == regime["setting"]["topology"]
    expected = [  # seed 0 of every group first, then seeds 1 and 2
        (s, t, seed)
        for wave in ((0,), (1, 2))
        for g in regime["groups"]
        for seed in wave
        for s, t in g
    ]
    assert [(r.config["spec"], r.config["target"], r.seed) for r in attacked] == expected
    assert [r.cost for r in plan] == sorted((r.cost for r in plan), reverse=True)  # priority
    for run in attacked:
        train, target = run.config["train"], run.config["target"]
        assert train["eval_every"] == train["epochs"] // 4 and train["partition"] == "iid"
        assert run.config["canaries"] == regimes.CANARIES_PER_VICTIM
        assert run.config["reference"]["kind"] == "gossip" and run.config["references"] == 4
        if target is None:
            assert (train["lr"], train["batch_size"]) == (sweep.NONPRIVATE["lr"], 32)
        else:  # the sweep's recipe at every epsilon
            recipe = sweep.ATTACK_PAGES_REGIME["dp"]
            assert (train["epochs"], train["lr"]) == (recipe["epochs"], recipe["lr"])
    overfit = runs.plan("privacy_attacks_overfit", False, {})
    assert overfit[0].key == "split/seed0"  # no network section, no references run apart
    assert all(r.config["train"]["epochs"] == 60 for r in overfit if r.config["kind"] == "attack")
    assert all("canaries" not in r.config for r in overfit)
    quick = runs.plan("privacy_attacks", True, {})
    assert quick[0].config["topologies"] == ["ring:4"] and len(quick) == 1 + 2 + 2 * (4 + 3)


def test_plateau_is_the_change_over_the_last_quarter():
    def row(accs):
        evals = [{"epoch": 5 * (k + 1), "acc_avg": a} for k, a in enumerate(accs)]
        return {"epochs": 20, "evals": evals, "acc_avg": accs[-1]}

    half, three, change = tables.plateau([row([0.5, 0.6, 0.7, 0.75]), row([0.5, 0.6, 0.8, 0.85])])
    assert half == "60.00 ± 0.00 %" and three == "75.00 ± 7.07 %" and change == "5.00 ± 0.00"
    # a row evaluated only at its end (the rows made before the quarters were recorded)
    assert tables.plateau([{"epochs": 20, "evals": [], "acc_avg": 0.8}]) == ("n/a", "n/a", "n/a")


def test_the_answers_say_where_the_neighbours_tpr_reaches_chance():
    from gossip_powersgd.privacy.attacks import null_band_of

    band = null_band_of(1000, 1000)
    tpr_hi, auc_hi = band["tpr"][0][1], band["auc"][1]

    def row(target, seed, tpr, auc):
        flat = {}
        for model in ("victim", "read off / public copy"):
            for attack in ("LiRA offline", "LiRA online"):
                flat[f"tpr0.1/{model}/{attack}"] = tpr
                flat[f"auc/{model}/{attack}"] = auc
        return {
            "spec": "exact",
            "target": target,
            "seed": seed,
            "members": 1000,
            "nonmembers": 1000,
            "acc_avg": 0.7,
            "last": 9,
            "rounds": {"9": {"flat": flat, "quality": {"read off / public copy": {}}}},
        }

    rows = [
        row(target, seed, tpr, auc)
        for target, tpr, auc in (
            (None, tpr_hi + 0.01, auc_hi + 0.2),  # without DP: above chance
            (64.0, tpr_hi / 2, auc_hi + 0.1),  # TPR at chance, AUC still above its band
            (8.0, tpr_hi / 2, auc_hi - 0.01),  # both at chance
        )
        for seed in (0, 1, 2)
    ]
    (line,) = [a for a in page.answers(rows) if a.startswith("- exact gossip")]
    assert line.count("above chance") == 2 and line.count(": chance)") == 2
    assert "TPR above chance only without DP, at chance at every ε ≤ 64." in line
    assert "All four AUCs are above the null band at ε = 64, ∞." in line


def test_the_committed_overfit_page_shows_its_rows_beside_their_blind_baseline_and_audit_split():
    name = "privacy_attacks_overfit"
    records = RowFile(RESULTS / f"{name}.jsonl").read()
    text = (RESULTS / f"{name}.md").read_text()
    row = records[runs.key("powergossip:rank=1", None, 0)].row
    group = [records[runs.key("powergossip:rank=1", None, s)].row for s in (0, 1, 2)]
    flats = [tables._last(r)["flat"] for r in group]
    line = (
        f"| PowerGossip r1 | none | victim | {tables._stat([f['auc/victim/LOSS'] for f in flats])} | "
        f"{tables._stat([f['auc/victim/LiRA offline'] for f in flats])} | "
    )
    assert line in text
    prior = tables._stat([f["auc/class prior"] for f in flats])
    assert f"| {prior} |" in text  # the blind baseline beside the figure
    # the audit record: the run's split, stored once per seed, members and held-out disjoint
    split = records["split/seed0"].row
    assert row["split"] == split["key"]
    for v in split["record"]["victims"]:
        held = set(split["record"]["heldout"][str(v)])
        assert held and not held & set(split["record"]["members"][str(v)])


def test_the_committed_rows_audit_figures_come_from_their_stored_guesses():
    records = RowFile(RESULTS / "privacy_attacks.jsonl").read()
    audited = [r.row for r in records.values() if "audit" in r.row]
    assert audited, "the committed page carries no audited run"
    text = (RESULTS / "privacy_attacks.md").read_text()
    for row in audited:
        for source in ("observer", "victim"):
            assert recheck_audit(row["audit"], source) == row["audit"][source]["epsilon"]
        assert f"{row['audit']['victim']['epsilon']:.2f}" in text
        if row["target"] is None:
            assert row["eps_max"] == float("inf")


def test_the_regimes_words_are_read_whole_from_their_snippets_file(tmp_path):
    # _markdown.snippets: a piece per "<!-- key -->", its lines in order, the preamble dropped
    (tmp_path / "words.md").write_text(
        "a comment\n\n<!-- A -->\none {x}\n\ntwo\n<!-- B -->\nthree\n"
    )
    got = snippets(str(tmp_path / "page.py"), "words.md")
    assert got == {"A": "one {x}\n\ntwo", "B": "three"}
    for name, r in regimes.REGIMES.items():
        for key in ("scale_note", "regime_text", "reference_words"):
            assert r[key] and "\n" not in r[key], (name, key)
        assert r["regime_text"].endswith("),"), name  # page.md puts the space after it
        assert len(r["not_reached"]) >= 4 and all(r["not_reached"]), name
