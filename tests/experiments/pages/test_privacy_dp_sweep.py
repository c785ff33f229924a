"""experiments/pages/privacy_dp_sweep.py: the sweep's part 2 planned from part 1's best row."""

from __future__ import annotations

from experiments.pages import _privacy as regime
from experiments.pages import privacy_dp_sweep as dp_sweep


def test_the_sweep_plans_part_2_from_part_1s_best_row():
    part1 = dp_sweep.plan(False, {})
    assert [r.config["row"]["label"] for r in part1] == [s[0] for s in regime.SWEEP]
    rows = {r.key: dict(r.config["row"], acc_avg=0.5) for r in part1}
    best = part1[3]  # batch 256, lr 4, C 0.5
    rows[best.key]["acc_avg"] = 0.9
    runs = dp_sweep.plan(False, rows)
    clipped = runs[len(part1)].config
    assert clipped["row"]["label"] == dp_sweep.CLIPPED
    assert (clipped["row"]["lr"], clipped["row"]["clip"], clipped["row"]["target"]) == (
        4.0,
        0.5,
        None,
    )
    assert clipped["train"]["dp_noise_multiplier"] == 0.0  # clipped, no noise
    part2 = [r.config for r in runs[len(part1) + 1 :]]
    assert len(part2) == 2 * len(dp_sweep.ALGORITHMS)
    for dp, plain in zip(part2[::2], part2[1::2]):
        assert dp["train"]["dp_target_epsilon"] == regime.TARGET and dp["row"]["lr"] == 4.0
        assert "dp_max_grad_norm" not in plain["train"] and plain["row"]["batch"] == 128
    # part 2 waits for every part-1 row (the best one could still change)
    assert dp_sweep.plan(False, dict(list(rows.items())[:-1])) == part1
