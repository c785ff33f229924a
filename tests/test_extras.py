"""extras.py: the optional extras a config needs, told from its text alone, importing nothing (the
training program's line before torch: tests/cli/test_train_startup.py)."""

import pytest

from gossip_powersgd import extras
from gossip_powersgd.extras import PRIVACY_PACKAGES, flat_values, missing_extra, needed


def test_the_flat_values_take_the_dp_section_then_the_overrides_as_written():
    data = {"dp": {"noise_multiplier": 1.0}, "backend": "local"}
    flat = flat_values(data, ["dp.target_epsilon=3", "backend=mpi", "loggers=[tensorboard", "x="])
    assert flat == {
        "dp_noise_multiplier": 1.0,
        "dp_target_epsilon": 3,
        "backend": "mpi",
        "loggers": "[tensorboard",  # not YAML: kept as text, nothing checked here
        "x": None,
    }


def test_what_needs_which_package_and_extra():
    config = {
        "dp_target_epsilon": 2.0,
        "loggers": ["tensorboard", {"wandb": {"mode": "offline"}}, "nope", {"a": 1, "b": 2}],
    }
    assert needed(config, ["backend=mpi"]) == [
        *[("differential privacy (dp_target_epsilon)", p, "privacy") for p in PRIVACY_PACKAGES],
        ("loggers: tensorboard", "tensorboard", "tracking"),
        ("loggers: wandb", "wandb", "tracking"),
        ("backend mpi", "mpi4py", "mpi"),
    ]
    assert needed({"dp_noise_multiplier": None, "loggers": []}) == []  # null: DP is off
    assert needed({"loggers": "mlflow"}) == [("loggers: mlflow", "mlflow", "tracking")]


def test_the_first_missing_package_is_one_line_with_its_pip_install(monkeypatch):
    monkeypatch.setattr(extras, "installed", lambda module: module != "dp_accounting")
    assert missing_extra({"dp": {"noise_multiplier": 1.0}}, ["backend=mpi"]) == (
        "differential privacy (dp_noise_multiplier) needs the dp_accounting package, which is "
        "not installed: pip install 'gossip_powersgd[privacy]'"
    )
    assert missing_extra({"backend": "mpi"}) is None


@pytest.mark.parametrize("module", ["no_such_module_xyz", "no_such_pkg.sub", ".relative"])
def test_a_module_that_cannot_be_found_is_not_installed(module):
    assert not extras.installed(module)
    assert extras.installed("json")
