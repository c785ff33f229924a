"""training/metric_names.py: the one naming table of the metrics and the numbers each tracker logs
(every key a real run writes is in the table: test_provenance.py)."""

import math

from gossip_powersgd.training import metric_names
from gossip_powersgd.training.metric_names import (
    ACCURACY_KEYS,
    RECORD_KEYS,
    record_scalars,
    summary_scalars,
)


def table_keys():
    """The first column of the docstring's table (one row per key, "a, _b" for a and its sibling)."""
    lines = metric_names.__doc__.splitlines()
    rules = [k for k, line in enumerate(lines) if line.startswith("=====")]
    keys = []
    for line in lines[rules[1] + 1 : rules[2]]:
        if not line or line.startswith(" "):
            continue  # a row's continuation
        first = line.split("  ")[0]
        stem, *siblings = [w.strip() for w in first.split(",")]
        keys.append(stem)
        keys += [stem.rsplit("_", 1)[0] + s for s in siblings]
    return keys


def test_the_documented_table_and_the_key_list_are_the_same_keys():
    documented = table_keys()
    assert "test_acc_max" in documented and "test_loss_max" in documented  # siblings expanded
    # the perplexity row documents _mean and _local in its text: the list holds them too
    assert set(documented) | {"test_perplexity_mean", "test_perplexity_local"} == set(RECORD_KEYS)
    assert len(RECORD_KEYS) == len(set(RECORD_KEYS))
    assert set(ACCURACY_KEYS) == {k for k in RECORD_KEYS if k.startswith("test_acc_")}


def test_a_records_finite_numbers_are_logged_under_kind_slash_key():
    record = {
        "kind": "eval",
        "step": 40,
        "epoch": 2,
        "test_acc_avg_model": 0.5,
        "model_sha256": "ab12",
        "epsilon_bound": "replace-one",
        "released": True,
        "epsilon": math.inf,
        "train_loss": math.nan,
    }
    assert record_scalars(record) == {"eval/epoch": 2.0, "eval/test_acc_avg_model": 0.5}
    assert record_scalars({"lr": 1}) == {"record/lr": 1.0}  # a record without its kind
    summary = {"steps": 40, "final_test_acc_avg_model": None, "algorithm": "exact", "peers": 4}
    assert summary_scalars(summary) == {"summary/steps": 40.0, "summary/peers": 4.0}
