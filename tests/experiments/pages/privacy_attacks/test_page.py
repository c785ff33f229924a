"""experiments/pages/privacy_attacks/page.py: the answers say where the neighbour's TPR reaches chance."""

from __future__ import annotations

from experiments.pages.privacy_attacks import page


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
