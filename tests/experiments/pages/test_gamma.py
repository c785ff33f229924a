"""experiments/pages/gamma.py: the verdict's sentences from hand-made rows (PowerGossip at the
topology's γ against its sweep's best, within 1 pp or not; its spread; what tuning moves Choco by;
the failed runs), and the γ grids around the topology's γ. The page end to end (--quick, its
committed rows drawn again byte for byte): tests/experiments/pages/test_every_page.py."""

from __future__ import annotations

from experiments.pages import gamma


def _row(algorithm, label, g, acc=None, error=None):
    row = {"algorithm": f"{algorithm}:gamma={g}", "label": label, "gamma": g}
    return dict(row, error=error) if error else dict(row, acc_avg=acc)


def test_the_verdict_compares_the_topologys_gamma_with_the_sweeps_best():
    rows = [
        _row("powergossip", "PowerGossip r1 (topology γ)", 0.4, 0.80),
        _row("powergossip", "PowerGossip r1", 0.8, 0.815),
        _row("powergossip", "PowerGossip r1", 0.1, 0.70),
        _row("choco", "Choco top-k 1%", 0.05, 0.60),
        _row("choco", "Choco top-k 1%", 0.5, 0.75),
        _row("choco", "Choco top-k 1%", 2.0, error="diverged at step 3 (loss nan)"),
    ]
    at, spread, choco, failed = gamma.gamma_verdict(rows, 0.4)
    assert "at the topology's γ = 0.4: 80.00 %; best of the sweep 81.50 % at γ = 0.8" in at
    assert "(1.50 pp better). The untuned value is NOT within 1 pp of the best." in at
    assert spread.endswith("(best − worst): 11.50 pp.")
    assert (
        "best 75.00 % at γ = 0.5, worst 60.00 % at γ = 0.05: tuning moves it by 15.00 pp" in choco
    )
    assert failed.startswith("- 1 run(s) failed or diverged (see the table): Choco top-k 1% γ = 2:")
    near = gamma.gamma_verdict([rows[0], dict(rows[1], acc_avg=0.805)], 0.4)
    assert near[0].endswith("The untuned value is near the best (within 1 pp).")
    assert gamma.gamma_verdict([], 0.4) == []


def test_the_plan_marks_one_powergossip_run_at_the_topologys_gamma_and_runs_it_first():
    for quick in (False, True):
        topology, epochs = gamma.SETTING[quick]
        runs = gamma.plan(quick, {})
        marked = [r for r in runs if r.config["label"].endswith("(topology γ)")]
        assert len(marked) == 1 and marked[0].config["gamma"] == gamma._topology_gamma(topology)
        kinds = [r.key.split("/")[0] for r in runs]
        assert kinds == sorted(kinds, key=["powergossip", "choco-topk"].index)  # PowerGossip first
        assert len(runs) == sum(len(v) for v in gamma.grids(quick).values())
        assert {r.config["train"]["epochs"] for r in runs} == {epochs}
