"""Training: data partitions, models, the decentralized trainer, configs and checkpoints.

    from gossip_powersgd.training import TrainConfig, load_config, train
    summary = LocalCluster(topology).run(train, load_config("experiments/configs/tiny.yaml"))

`TrainingHooks` (in `hooks.py`) are the loop's extension points: `train(comm, config, hooks=[...])`.
"""

from .config import TrainConfig, dump_config, load_config, validate_config
from .keydocs import describe_keys
from .hooks import SetupContext, TrainingHooks
from .trainer import format_summary, learning_rate, train

__all__ = [
    "TrainConfig",
    "describe_keys",
    "dump_config",
    "load_config",
    "validate_config",
    "SetupContext",
    "TrainingHooks",
    "format_summary",
    "learning_rate",
    "train",
]
