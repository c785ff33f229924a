"""`privacy.dp_report`: what a private run reports — the summary table's DP rows (private
epsilons stay private, released ones as [min, max] with their labels, the network figure never
as the guarantee), the progress line's worst epsilon, and infinity through JSON."""

from __future__ import annotations

import json
import math

from gossip_powersgd.privacy.accounting import ADD_REMOVE, LOCAL_BOUND, NETWORK_LABEL, REPLACE_ONE
from gossip_powersgd.privacy.dp_report import (
    TUNING_NOTE,
    dp_summary_rows,
    eval_text,
    from_json_number,
    json_number,
    peer_epsilons,
)

PUBLIC = {
    "noise_multiplier": 1.1,
    "max_grad_norm": 1.0,
    "delta": 1e-5,
    "dp_adjacency": ADD_REMOVE,
    "dp_randomness_note": "each peer's own OS entropy",
    "dp_tuning": TUNING_NOTE,
}


def test_infinity_travels_through_json_as_a_string_and_back():
    for value in (0.0, 2.5, 1e308, math.inf):
        text = json.dumps(json_number(value))  # strict JSON: no Infinity token
        assert "Infinity" not in text and from_json_number(json.loads(text)) == value
    assert json_number(3.25) == 3.25 and json_number(math.inf) == "inf"


def test_a_run_without_dp_has_no_dp_rows():
    assert dp_summary_rows({"steps": 10}) == []


def test_private_epsilons_are_reported_as_private_with_the_public_figures():
    rows = dict(dp_summary_rows({**PUBLIC, "epsilon_per_peer": "each peer's own file"}))
    assert rows["DP noise multiplier σ / clip norm C"] == "1.1 / 1.0"
    assert rows["DP δ"] == "1e-05" and rows["DP adjacency"] == ADD_REMOVE
    assert rows[f"ε ({LOCAL_BOUND}, add/remove), sampling rate"] == "private: each peer's own file"
    assert rows["DP hyper-parameter tuning"] == TUNING_NOTE
    assert not any(key.startswith("DP sampling rate") for key in rows)


def test_a_peer_absent_from_the_released_figures_is_named_and_never_read_as_zero():
    """A null entry (a peer not a member at the end, `DifferentialPrivacy.summary_fields`) was
    not expected: the span read it (TypeError); now it is left out and named, and the worst
    epsilon counts it as unknown (inf)."""
    label = "ε (local DP-SGD, add/remove; Opacus RDP)"
    summary = {
        **PUBLIC,
        "sample_rate": [0.02, None, 0.05],
        "epsilon": [3.0, None, 1.5],
        "epsilon_labels": {"epsilon": label},
    }
    rows = dict(dp_summary_rows(summary))
    absent = " (without peer 1: not members at the end)"
    assert rows["DP sampling rate q [min, max]"] == "[0.02, 0.05]" + absent
    assert rows[f"{label} at δ [min, max]"] == "[1.5, 3]" + absent
    assert peer_epsilons(summary) == [3.0, math.inf, 1.5]


def test_released_epsilons_are_spans_under_their_labels_and_inf_is_the_largest():
    label = "ε (local DP-SGD, add/remove; Opacus RDP)"
    summary = {
        **PUBLIC,
        "noise_multiplier": None,  # a per-peer sigma (dp_target_epsilon)
        "sample_rate": [0.02, 0.0125, 0.05],
        "epsilon": [3.0, "inf", 1.23456],
        "epsilon_labels": {"epsilon": label},
    }
    rows = dict(dp_summary_rows(summary))
    assert rows["DP noise multiplier σ / clip norm C"] == "per peer / 1.0"
    assert rows["DP sampling rate q [min, max]"] == "[0.0125, 0.05]"
    assert rows[f"{label} at δ [min, max]"] == "[1.235, inf]"
    assert not any("private" in value for value in rows.values())


def test_the_network_figure_is_named_apart_from_the_guarantee():
    summary = {**PUBLIC, "epsilon_per_peer": "private", "dp_network_bound": "see note"}
    summary["dp_adjacency"] = REPLACE_ONE
    rows = dict(dp_summary_rows(summary))
    assert rows[NETWORK_LABEL] == f"see note; the guarantee is ε ({LOCAL_BOUND}, replace-one)"
    # the tuning note stays the last row, after the network figure
    assert [key for key, _ in dp_summary_rows(summary)][-2:] == [
        NETWORK_LABEL,
        "DP hyper-parameter tuning",
    ]


def test_the_progress_line_shows_the_worst_epsilon_only_where_it_is_released():
    assert eval_text({"loss": 0.3}) == ""
    assert eval_text({"epsilon_max": 1.23456}) == "  worst ε 1.23"
    assert eval_text({"epsilon_max": "inf", "epsilon_bound": "ε (local DP-SGD)"}) == (
        "  worst ε (local DP-SGD) inf"
    )


def test_peer_epsilons_parse_infinity_and_a_run_without_released_figures_has_none():
    from gossip_powersgd.privacy.dp_report import peer_epsilons

    assert peer_epsilons({"epsilon": [1.5, "inf", 2]}) == [1.5, math.inf, 2.0]
    assert peer_epsilons({}) == [math.inf]  # nothing released: no guarantee to report


def test_dp_measurements_read_the_run_at_three_quarters_and_over_time():
    """8 epochs evaluated every 2: the evaluation at epoch 6 is ¾ of the run; an evaluation
    without a consensus distance is left out of the history; the extremes of the peers'
    figures."""
    from types import SimpleNamespace

    from gossip_powersgd.privacy.dp_report import dp_measurements

    evals = [
        dict(epoch=e, test_acc_avg_model=e / 10, consensus_distance=None if e == 4 else 1 / e)
        for e in (2, 4, 6, 8)
    ]
    summary = dict(epsilon=[3.0, 2.5], sample_rate=[0.01, 0.02], noise_multiplier=1.2)
    summary.update(delta=1e-5, final_consensus_distance=0.125)
    result = SimpleNamespace(summary=summary, evals=evals, config=SimpleNamespace(epochs=8))
    m = dp_measurements(result)
    assert m["acc_3q"] == 0.6 and m["consensus"] == 0.125
    assert m["consensus_history"] == [(2, 0.5), (6, 1 / 6), (8, 0.125)]
    assert (m["eps_min"], m["eps_max"], m["q_min"], m["q_max"]) == (2.5, 3.0, 0.01, 0.02)
    assert (m["sigma"], m["delta"]) == (1.2, 1e-5)


def test_dp_measurements_of_a_real_private_run_stay_within_the_target():
    """A tiny DP-SGD run (ring:4, target epsilon 3, the peers' figures released): every peer
    ends at or below the target the accountant solved sigma for (its rate the largest one's or
    smaller), at a sampling rate batch / shard, and 4 epochs evaluated every epoch give the
    epoch-3 accuracy."""
    from gossip_powersgd import run
    from gossip_powersgd.privacy.dp_report import dp_measurements

    config = dict(dataset="synthetic_logreg:d=8,classes=3,n=400", model="logreg", epochs=4)
    config.update(topology="ring:4", algorithm="exact", batch_size=20, lr=0.5, seed=0)
    config.update(backend="local", quiet=True, log_every=0, eval_every=1, warmup_epochs=0.0)
    config.update(dp_target_epsilon=3.0, dp_max_grad_norm=1.0, dp_delta=1e-5)
    result = run(dict(config, release_peer_statistics=True))
    m = dp_measurements(result)
    assert m["eps_max"] <= 3.0 + 1e-6 and m["eps_min"] > 0 and m["sigma"] > 0
    assert 0 < m["q_min"] <= m["q_max"] < 1 and m["delta"] == 1e-5
    three = next(e for e in result.evals if e["epoch"] == 3)
    assert m["acc_3q"] == three["test_acc_avg_model"]
    assert len(m["consensus_history"]) == len(result.evals)
