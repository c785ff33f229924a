"""The pages of the DP remedy (dp_subspace) and of the mechanisms page's budget: their verdicts
from known numbers, and a quick page computed from its runs that renders again the same."""

import json

import pytest

from experiments import privacy_mechanisms_budget as budget
from experiments.privacy_attacks import dp_subspace

PLAIN, PROJECTED = dp_subspace.VARIANTS[1][0], dp_subspace.VARIANTS[2][0]


def _row(label, seed, acc, target=8.0, consensus=1.0):
    return dict(
        label=label,
        target=target,
        seed=seed,
        acc_avg=acc,
        consensus=consensus,
        consensus_history=[(15, 10 * consensus), (30, consensus)],
    )


@pytest.mark.parametrize(
    "variant, word",
    [
        ([0.60, 0.62, 0.61], "worse than it"),  # -20 pp, sd 1 pp
        ([0.805, 0.815, 0.81], "not distinguishable from it"),  # +0 pp
        ([0.90, 0.91, 0.92], "better than it"),  # +10 pp
    ],
)
def test_a_variant_is_judged_against_its_plain_rank_by_twice_the_seed_spread(variant, word):
    rows = [_row(PLAIN, s, a, consensus=5.0) for s, a in enumerate([0.80, 0.82, 0.81])]
    rows += [_row(PROJECTED, s, a, consensus=0.02) for s, a in enumerate(variant)]
    table = dp_subspace.cells(rows)
    assert table[(PROJECTED, 8.0)]["consensus_gm"] == pytest.approx(0.02)
    assert table[(PLAIN, 8.0)]["history_gm"] == pytest.approx({15: 50.0, 30: 5.0})
    text = dp_subspace.verdict_text(table, [8.0])
    assert f"{PROJECTED} reaches" in text and word in text
    assert "consensus distance at the end 0.02 against 5" in text
    # the paragraph's "does not rescue" only when the variant is worse by the rule
    rescued = dp_subspace.conclusion(table, [8.0])
    assert "5 → 0.02 at ε = 8" in rescued
    assert ("does not rescue" in rescued) == (word == "worse than it")


def test_one_seed_gives_no_verdict_and_a_failed_run_is_counted():
    rows = [_row(PLAIN, 0, 0.8), _row(PROJECTED, 0, 0.6), dict(_row(PROJECTED, 1, 0), error="x")]
    table = dp_subspace.cells(rows)
    assert table[(PROJECTED, 8.0)]["failed"] == 1
    assert "one seed: no spread to judge it by" in dp_subspace.verdict_text(table, [8.0])


def test_the_quick_subspace_page_is_computed_from_its_runs_and_renders_again(tmp_path):
    assert dp_subspace.main(["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "privacy_dp_subspace.json").read_text())
    rows = list(saved["rows"].values())
    assert len(rows) == len(dp_subspace.QUICK_VARIANTS)
    # the same epsilon for the plain and the projected run: the projection is post-processing
    assert len({(r["sigma"], r["eps_max"]) for r in rows}) == 1
    projected = next(r for r in rows if r["extra"])
    assert projected["extra"] == {"dp_exchanged_subspace": True}
    page = (tmp_path / "privacy_dp_subspace.md").read_text()
    assert not (tmp_path / "privacy_dp_subspace.partial.json").exists()
    body = page[page.index("## Accuracy") :]
    assert dp_subspace.main(["--quick", "--render-only", "--out", str(tmp_path)]) == 0
    again = (tmp_path / "privacy_dp_subspace.md").read_text()
    assert again[again.index("## Accuracy") :] == body


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
    runs = [
        dict(generated="g", rows=_budget_rows(128, short) + _budget_rows(128, [0.9], "none")),
        dict(generated="g", rows=_budget_rows(256, long) + _budget_rows(256, [0.95], "none")),
    ]
    table = budget.cells(runs)
    assert budget.verdicts(table) == {"ring:8": expected}
    (step,) = budget.doublings(table[("ring:8", "local", "exact gossip")])
    assert step["gain"] == pytest.approx(100 * (sum(long) / len(long) - sum(short) / len(short)))


def test_the_budget_page_needs_two_finished_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        budget.main(["--runs", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "o")])
    assert "no finished privacy_mechanisms run there" in str(exc.value)
    with pytest.raises(SystemExit) as exc:
        budget.main(["--render-only", "--out", str(tmp_path / "none")])
    assert exc.value.code != 0
    assert "make the page with --runs first" in capsys.readouterr().err


def _budget_run(folder, epochs, accs, when):
    """A finished privacy_mechanisms run as the budget page reads it: one ring:8 section with a
    non-private and a local DP-SGD row per seed."""
    folder.mkdir()
    rows = [
        dict(r, steps=16 * epochs, acc_3q=r["acc_avg"])
        for r in _budget_rows(epochs, accs) + _budget_rows(epochs, [0.95] * len(accs), "none")
    ]
    (folder / "privacy_mechanisms.json").write_text(
        json.dumps([dict(setting=dict(topology="ring:8", epochs=epochs), rows=rows)])
    )
    (folder / "privacy_mechanisms.header.json").write_text(
        json.dumps(dict(generated=f"Generated by `x --epochs {epochs}` {when}."))
    )
    return folder


def test_the_budget_page_extends_its_recorded_runs(tmp_path, capsys):
    """--extend keeps the recorded runs (their folders gone) and adds a larger budget: 128 -> 256
    pays (+3 pp against a 0.5 pp sd), 256 -> 512 does not (+0.1 pp), so 256 is the plateau."""
    out = tmp_path / "page"
    a = _budget_run(tmp_path / "a", 128, [0.870, 0.875, 0.880], "then")
    b = _budget_run(tmp_path / "b", 256, [0.900, 0.905, 0.910], "later")
    budget.main(["--runs", str(a), str(b), "--out", str(out)])
    assert json.loads((out / "privacy_mechanisms_budget.json").read_text())["verdicts"] == {
        "ring:8": None
    }
    for folder in (a, b):
        for f in folder.iterdir():
            f.unlink()
    c = _budget_run(tmp_path / "c", 512, [0.901, 0.906, 0.911], "last")
    budget.main(["--extend", "--runs", str(c), "--out", str(out)])
    saved = json.loads((out / "privacy_mechanisms_budget.json").read_text())
    assert saved["verdicts"] == {"ring:8": 256} and len(saved["runs"]) == 3
    page = (out / "privacy_mechanisms_budget.md").read_text()
    assert "| 128 epochs | 256 epochs | 512 epochs | 128 → 256 | 256 → 512 |" in page
    assert "**256 epochs**: no private row gains clearly from doubling it" in page
    assert "x --epochs 128\nx --epochs 256\nx --epochs 512\n" in page  # every run's command
    with pytest.raises(SystemExit) as exc:  # the same run twice
        budget.main(["--extend", "--runs", str(c), "--out", str(out)])
    assert exc.value.code != 0 and "already on the page" in capsys.readouterr().err


def test_dp_on_the_messages_is_costed_by_the_same_accountant():
    """The page's reason not to run DP on what is sent: one Gaussian mechanism per message
    (q = 1, sensitivity 2B), composed over the run's steps; its noise is 2 z B with z from the
    same solver, and more messages need more noise."""
    from experiments.suite.privacy import DELTA
    from gossip_powersgd.privacy.accounting import noise_for_target

    rows = [dict(target=8.0, steps=960), dict(target=3.0, steps=480)]
    text = dp_subspace._message_dp(rows, [8.0, 3.0])
    z8 = noise_for_target(8.0, DELTA, [1.0], 960)
    assert "ε = 8 over the 960 messages" in text and f"std {2 * z8:.3g} B" in text
    assert noise_for_target(8.0, DELTA, [1.0], 1920) > z8 > 10  # noise far above the message
    assert "not computed" in dp_subspace._message_dp([], [8.0])
