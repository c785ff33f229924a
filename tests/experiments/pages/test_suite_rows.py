"""experiments/pages/_suite_rows.py: the training suite's runs (training, gamma) keep γ as a number
in the stored config and put it into the spec only when the run is made; stored rows get their
curve back from their evaluations."""

from __future__ import annotations

from experiments.pages._suite_rows import spec_of, suite_run, with_curves


def test_gamma_goes_into_the_spec_only_where_the_template_asks_for_it():
    template = "powergossip:rank=1,gamma={gamma}"
    assert spec_of(template, 0.1) == "powergossip:rank=1,gamma=0.1"
    assert spec_of(template, 1 / 3) == f"powergossip:rank=1,gamma={1 / 3!r}"  # every digit
    assert spec_of("exact", 0.5) == "exact"


def test_a_run_stores_its_gamma_as_a_number_and_copies_its_config():
    train = {"algorithm": "choco:compressor=topk:0.01,gamma={gamma}", "epochs": 1}
    run = suite_run("k", "Choco", train, seed=2, kind="sweep", gamma=0.25, cost=3.0)
    assert (run.key, run.seed, run.cost) == ("k", 2, 3.0)
    assert run.config == {"label": "Choco", "kind": "sweep", "gamma": 0.25, "train": train}
    train["epochs"] = 99
    assert run.config["train"]["epochs"] == 1  # the plan's config is the run's own copy


def test_stored_rows_get_their_curve_from_their_evaluations():
    rows = [{"evals": [{"mb": 1.0, "acc_avg": 0.5}, {"mb": 2.0, "acc_avg": 0.7}]}, {"error": "x"}]
    assert [r["curve"] for r in with_curves(rows)] == [[(1.0, 0.5), (2.0, 0.7)], []]
    assert "curve" not in rows[0]  # copies: the stored rows are left as they were
