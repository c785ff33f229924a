"""The attack rows: a real run, every peer's view recorded, the colluders' views attacked
(`gossip_powersgd.privacy.knowledge_attack.colluder_attack`, scored against the other peers' own
records). Two regimes:

* ``averaging`` (the paper's first setting, ``updates="once"``): each peer trains alone on its
  shard for one epoch (``local_steps`` = an epoch, so the first gossip step comes after it), then
  the learning rate drops by 1e-30 (float32 updates below the models' resolution: the models stop
  changing) and the peers gossip-average their privately trained models for the remaining epochs.
* ``dsgd`` (decentralized SGD, ``updates="every_step"``): one local step per gossip step, attacked
  exactly (every update an unknown) and with updates tied over windows of `tie` steps.
"""

from __future__ import annotations

from typing import Any, Dict

from gossip_powersgd.privacy.knowledge_attack import colluder_attack, observe_every_peer

#: A drop of the learning rate that leaves float32 models unchanged (|lr * g| far below an ulp).
FREEZE = 1e-30


def train_config(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """The `gossip_powersgd.run` config of an attack run (every rank observed)."""
    train = dict(config["train"], seed=seed, backend="local", quiet=True)
    train.update(algorithm=config["algorithm"], topology=config["topology"])
    if config["regime"] == "averaging":
        train.update(local_steps=config["epoch_steps"], schedule="step", milestones=[1.0])
        train.update(decay=FREEZE)
    return train


def attack_row(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """One run (every view recorded, `observe_every_peer`), then each colluder set's attack."""
    train = train_config(config, seed)
    result, views, x0 = observe_every_peer(train)
    summary = result.summary
    epochs = train["epochs"]
    if config["regime"] == "averaging" and summary["steps"] != epochs * config["epoch_steps"]:
        raise ValueError(
            f"{summary['steps']} optimizer steps in {epochs} epochs: epoch_steps "
            f"{config['epoch_steps']} is not an epoch, so the first gossip step is not after it"
        )
    modes = {"once": ("once", 1)}
    if config["regime"] == "dsgd":
        modes = {
            "every_step": ("every_step", 1),
            f"tie={config['tie']}": ("every_step", config["tie"]),
        }
    attacks = [
        colluder_attack(views, list(c), config["topology"], x0, config["regime"], modes)
        for c in config["colluder_sets"]
    ]
    return {
        "regime": config["regime"],
        "algorithm": config["algorithm"],
        "label": config["label"],
        "topology": config["topology"],
        "steps": 1 + max(views[0].steps),
        "modes": list(modes),
        "accuracy": summary["final_test_acc_avg_model"],
        "local_accuracy": summary["final_test_acc_local_mean"],
        "attacks": attacks,
    }
