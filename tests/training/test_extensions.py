"""training/extensions.py: the `loggers:` and `hooks:` config keys: their entries, the trackers and
user hooks they build, in which order (what the trackers log: test_trackers.py)."""

import pytest

from gossip_powersgd.training.config import TrainConfig, validate_config
from gossip_powersgd.training.extensions import (
    config_hooks,
    entries,
    make_trackers,
    make_user_hooks,
)
from gossip_powersgd.training.hooks import TrainingHooks
from gossip_powersgd.training.trackers import TRACKERS


class Scaled(TrainingHooks):
    def __init__(self, factor=1):
        self.factor = factor


HOOK = f"{__name__}:Scaled"


def test_entries_are_names_or_one_key_mappings_to_options():
    assert entries("tensorboard", "loggers") == [("tensorboard", {})]
    assert entries(("a", {"b": {"x": 1}}, {"c": None}), "loggers") == [
        ("a", {}),
        ("b", {"x": 1}),
        ("c", {}),
    ]
    assert entries({"b": {"x": 1}}, "hooks") == [("b", {"x": 1})]  # one mapping alone
    assert entries([], "hooks") == []


@pytest.mark.parametrize(
    "value, message",
    [
        (3, r"^bad value for 'hooks': 3 is not a list \(e\.g\. hooks: \[name\]\)$"),
        ([""], "'' is neither a name nor a one-key mapping"),
        ([{"a": {}, "b": {}}], "is neither a name nor a one-key mapping"),
        ([{"a": [1]}], "is neither a name nor a one-key mapping"),
        ([{"a": {1: 2}}], r"^bad value for 'hooks': the options of 'a' need string keys$"),
    ],
)
def test_a_malformed_entry_is_a_one_line_error(value, message):
    with pytest.raises(ValueError, match=message):
        entries(value, "hooks")


def test_user_hooks_are_built_with_their_options_before_the_trackers():
    hooks = make_user_hooks([HOOK, {HOOK: {"factor": 3}}])
    assert [type(h) for h in hooks] == [Scaled, Scaled] and [h.factor for h in hooks] == [1, 3]
    built = config_hooks(TrainConfig(hooks=[HOOK], loggers=["tensorboard"]))
    assert [type(h) for h in built] == [Scaled, TRACKERS["tensorboard"]]
    assert [type(t) for t in make_trackers([])] == []


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("loggers", ["nope"], "loggers: unknown logger 'nope'; valid: tensorboard, wandb, mlflow"),
        ("loggers", [3], "is neither a name nor a one-key mapping"),
        ("hooks", ["os:path"], "hooks: 'os:path': 'path' is not callable"),
        (
            "hooks",
            ["gossip_powersgd.training.config:TrainConfig"],
            "is not a TrainingHooks subclass",
        ),
        (
            "hooks",
            [{"tests.training.test_trackers:Recorder": {"colour": 1}}],
            "does not take the options ['colour']",
        ),
    ],
)
def test_bad_loggers_and_hooks_are_one_line_errors(key, value, message):
    with pytest.raises(ValueError, match=None) as info:
        validate_config(TrainConfig(**{key: value}), deep=False)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_every_mistake_is_named_in_the_one_line():
    with pytest.raises(ValueError) as info:
        validate_config(
            TrainConfig(loggers=[{"tensorboard": {"logdir": "x", "flushsecs": 1}}]), deep=False
        )
    assert "'logdir'" in str(info.value) and "'flushsecs'" in str(info.value)
