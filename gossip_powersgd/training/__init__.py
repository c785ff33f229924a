"""Training: data partitions, models, the decentralized trainer, configs and checkpoints.

    from gossip_powersgd.training import TrainConfig, load_config, train
    summary = LocalCluster(topology).run(train, load_config("experiments/configs/tiny.yaml"))

`TrainingHooks` (in `hooks.py`) are the loop's extension points: `train(comm, config, hooks=[...])`.
The names are imported on first use (PEP 562): reading a config (`config.py`) imports no torch.
"""

from typing import TYPE_CHECKING

from ..utils import lazy_exports

#: Each public name -> the module it lives in (imported when the name is first read).
_HOMES = {
    "TrainConfig": "config",
    "describe_keys": "keydocs",
    "dump_config": "config",
    "load_config": "config",
    "validate_config": "config",
    "SetupContext": "hooks",
    "TrainingHooks": "hooks",
    "format_summary": "trainer",
    "learning_rate": "trainer",
    "train": "trainer",
}

if TYPE_CHECKING:
    from .config import (  # noqa: F401
        TrainConfig,
        dump_config,
        load_config,
        validate_config,
    )
    from .hooks import SetupContext, TrainingHooks  # noqa: F401
    from .keydocs import describe_keys  # noqa: F401
    from .trainer import format_summary, learning_rate, train  # noqa: F401


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = list(_HOMES)
