"""experiments/pages/privacy_attacks/runs.py: each regime's plan holds its network section, its splits,
its references and its attacked runs in order."""

from __future__ import annotations

from experiments.pages import privacy_regime as sweep
from experiments.pages.privacy_attacks import regimes, runs


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
