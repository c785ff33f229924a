"""experiments/pages/privacy_attacks/tables.py: the plateau is the change over the last quarter."""

from __future__ import annotations

from experiments.pages.privacy_attacks import tables


def test_plateau_is_the_change_over_the_last_quarter():
    def row(accs):
        evals = [{"epoch": 5 * (k + 1), "acc_avg": a} for k, a in enumerate(accs)]
        return {"epochs": 20, "evals": evals, "acc_avg": accs[-1]}

    half, three, change = tables.plateau([row([0.5, 0.6, 0.7, 0.75]), row([0.5, 0.6, 0.8, 0.85])])
    assert half == "60.00 ± 0.00 %" and three == "75.00 ± 7.07 %" and change == "5.00 ± 0.00"
    # a row evaluated only at its end (the rows made before the quarters were recorded)
    assert tables.plateau([{"epochs": 20, "evals": [], "acc_avg": 0.8}]) == ("n/a", "n/a", "n/a")
