"""Training: data partitions, models, the decentralized trainer, configs and checkpoints.

    from gossip_powersgd.training import TrainConfig, load_config, train
    summary = LocalCluster(topology).run(train, load_config("experiments/configs/tiny.yaml"))
"""

from .config import TrainConfig, describe_keys, dump_config, load_config, validate_config
from .trainer import format_summary, learning_rate, train

__all__ = ["TrainConfig", "describe_keys", "dump_config", "load_config", "validate_config",
           "format_summary", "learning_rate", "train"]
