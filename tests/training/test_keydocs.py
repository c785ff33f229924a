"""training/keydocs.py: every config key documented from where it is declared (`--help-config` and
the configuration reference)."""

from gossip_powersgd.algorithms.registry import REGISTRY
from gossip_powersgd.training.config import TrainConfig, valid_keys
from gossip_powersgd.training.keydocs import CORE, describe_keys, key_reference
from gossip_powersgd.training.partition import PARTITION_NAMES


def by_name():
    return {k.name: k for k in key_reference()}


def test_every_key_in_order_with_its_documentation_and_default():
    reference = key_reference()
    assert [k.name for k in reference] == list(valid_keys())
    assert [k.name for k in reference if not k.doc.strip()] == []  # a key without its comment
    defaults = TrainConfig().to_dict()
    assert all(k.default == defaults[k.name] for k in reference)


def test_a_comment_over_several_lines_is_one_line():
    doc = by_name()["topology"].doc
    assert doc.startswith('Gossip graph, as `topologies.parse` spells it: "ring:8"')
    assert doc.endswith("or the launcher's world size (mpi and torch backends).")
    assert "\n" not in doc and "#:" not in doc


def test_core_keys_list_the_names_the_validation_accepts_and_features_their_section():
    keys = by_name()
    assert keys["partition"].choices == tuple(PARTITION_NAMES)
    options = ",".join(f"{o}=..." for o in sorted(REGISTRY["powergossip"].options))
    assert (
        f"powergossip:{options}" in keys["algorithm"].choices
        and "allreduce" in keys["algorithm"].choices
    )
    assert (keys["lr"].group, keys["lr"].section, keys["lr"].nested) == (CORE, None, None)
    dp = keys["dp_noise_multiplier"]
    assert (dp.group, dp.section, dp.nested) == ("dp", "dp", "noise_multiplier")


def test_describe_keys_is_one_line_per_key_with_its_default():
    lines = describe_keys().splitlines()
    assert len(lines) == len(valid_keys())
    assert "lr (0.1)  Peak learning rate (reached after the warm-up)." in lines
