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
